from .loading import (LoadReport, load_checkpoint_file, load_pretrained,
                      load_state_dict_reported, unwrap_state_dict)
from .swin import (adapt_swin_state_dict, convert_swin_state_dict, detect_swin_format,
                   unfold_order_from_microsoft)

__all__ = [
    'LoadReport', 'load_checkpoint_file', 'load_pretrained', 'load_state_dict_reported',
    'unwrap_state_dict', 'adapt_swin_state_dict', 'convert_swin_state_dict',
    'detect_swin_format', 'unfold_order_from_microsoft'
]

from .loading import (DERIVED_KEYS, CheckpointError, CheckpointFamily, CheckpointNotFoundError,
                      LoadReport, check_checkpoint_file, fit_checkpoint, load_checkpoint_file,
                      load_pretrained, load_state_dict_reported, unwrap_state_dict)
from .swin import (adapt_swin_state_dict, convert_swin_state_dict, detect_swin_format,
                   unfold_order_from_microsoft)

__all__ = [
    'DERIVED_KEYS', 'CheckpointFamily', 'fit_checkpoint', 'CheckpointError',
    'CheckpointNotFoundError', 'check_checkpoint_file',
    'LoadReport', 'load_checkpoint_file', 'load_pretrained', 'load_state_dict_reported',
    'unwrap_state_dict', 'adapt_swin_state_dict', 'convert_swin_state_dict',
    'detect_swin_format', 'unfold_order_from_microsoft'
]
from .swin3d import (convert_swin3d_state_dict, detect_swin3d_format,  # noqa: E402
                     inflate_swin2d_state_dict, microsoft_order_from_unfold)
__all__ += ['convert_swin3d_state_dict', 'detect_swin3d_format', 'inflate_swin2d_state_dict',
            'microsoft_order_from_unfold']
from .safe_load import (UntrustedCheckpointError, install_safe_loading,  # noqa: E402
                        safe_torch_load)
from .hybrid_vit import (adapt_hybrid_state_dict, convert_hybrid_state_dict,  # noqa: E402
                         detect_hybrid_format)
__all__ += ['adapt_hybrid_state_dict', 'convert_hybrid_state_dict', 'detect_hybrid_format']

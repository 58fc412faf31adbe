"""Checkpoint files and families (torch only): reading files, one family per model as data,
and the one engine that fits a state dict to a model (:func:`fit_checkpoint`)."""
from .files import (Checkpoint, CheckpointError, CheckpointNotFoundError,
                    UntrustedCheckpointError, check_checkpoint_file, check_safetensors_file,
                    load_checkpoint_file, load_safetensors_file, load_sharded_checkpoint,
                    read_checkpoint, resolve_hub_cache_dir, safe_torch_load)
from .loading import (DERIVED_KEYS, CheckpointFamily, LoadReport, check_unrepresentable,
                      fit_checkpoint, load_pretrained, load_pretrained_dict,
                      load_state_dict_reported, unwrap_state_dict)
from .swin import (adapt_swin_state_dict, convert_swin_state_dict, detect_swin_format,
                   unfold_order_from_microsoft)
from .swin3d import (convert_swin3d_state_dict, detect_swin3d_format,
                     inflate_swin2d_state_dict, microsoft_order_from_unfold)
from .hybrid_vit import (adapt_hybrid_state_dict, convert_hybrid_state_dict,
                         detect_hybrid_format)

__all__ = [
    'DERIVED_KEYS', 'CheckpointFamily', 'fit_checkpoint', 'check_unrepresentable', 'Checkpoint',
    'CheckpointError', 'CheckpointNotFoundError', 'UntrustedCheckpointError',
    'check_checkpoint_file', 'check_safetensors_file', 'load_safetensors_file',
    'load_sharded_checkpoint', 'read_checkpoint', 'resolve_hub_cache_dir', 'safe_torch_load', 'LoadReport', 'load_checkpoint_file', 'load_pretrained',
    'load_pretrained_dict', 'load_state_dict_reported', 'unwrap_state_dict',
    'adapt_swin_state_dict', 'convert_swin_state_dict', 'detect_swin_format',
    'unfold_order_from_microsoft', 'convert_swin3d_state_dict', 'detect_swin3d_format',
    'inflate_swin2d_state_dict', 'microsoft_order_from_unfold', 'adapt_hybrid_state_dict',
    'convert_hybrid_state_dict', 'detect_hybrid_format'
]

from .attention import Attention, WindowAttention
from .ffn import FFN, DropPath, drop_path_schedule
from .patch import ConvStem, PatchEmbed, PatchMerging
from .pos_embed import grid_size, resize_pos_embed, resize_rel_pos_1d, resize_rel_pos_table
from .shifted_window import (ShiftWindowMSA, merge_windows, partition_windows,
                             shared_window_indices, shifted_window_attention)
from .switch import fast_path_active, is_tracing, set_fast_path
from .window import (ceil_div, effective_window, pad_amount, pad_to_multiple,
                     relative_position_index, shift_window_mask, to_tuple, window_gather_index,
                     window_partition, window_reverse)
from .arch import (linear_drop_path, resolve_arch, resolve_indices, validate_stages,
                   window_and_shift)
from .mlp import FcNamedFFN
from .norm import LayerNorm2d, build_act, build_batch_norm, build_layer_norm, group_norm
from .stems import MaxPool2dSame, StdConv2d, pad_same, same_padding, standardize_weight
from .cosine_window import (LOGIT_SCALE_MAX, CosineWindowAttention, ShiftWindowMSAV2,
                            continuous_position_bias, cpb_mlp, log_spaced_relative_coords,
                            pretrained_window_of)

__all__ = [
    'Attention', 'WindowAttention', 'FFN', 'DropPath', 'drop_path_schedule', 'ConvStem',
    'PatchEmbed', 'PatchMerging', 'ShiftWindowMSA', 'shared_window_indices',
    'shifted_window_attention', 'partition_windows', 'merge_windows', 'grid_size',
    'resize_pos_embed', 'resize_rel_pos_1d', 'resize_rel_pos_table', 'fast_path_active',
    'is_tracing', 'set_fast_path', 'ceil_div', 'effective_window', 'pad_amount', 'pad_to_multiple',
    'relative_position_index', 'shift_window_mask', 'to_tuple', 'window_gather_index',
    'window_partition', 'window_reverse', 'linear_drop_path', 'resolve_arch', 'resolve_indices',
    'validate_stages', 'window_and_shift', 'FcNamedFFN', 'LayerNorm2d', 'build_act',
    'build_batch_norm', 'build_layer_norm', 'group_norm', 'MaxPool2dSame', 'StdConv2d',
    'pad_same', 'same_padding', 'standardize_weight', 'LOGIT_SCALE_MAX', 'CosineWindowAttention',
    'ShiftWindowMSAV2', 'continuous_position_bias', 'cpb_mlp', 'log_spaced_relative_coords',
    'pretrained_window_of'
]

# DINOv3's 2-D RoPE and SAM's neck (helper H6)
from .rope import (RotaryPositionEmbedding2d, apply_rope, patch_center_coords,  # noqa: E402
                   rope_cos_sin, rope_periods, rotate_half)
from .neck import SamNeck  # noqa: E402

__all__ += ['RotaryPositionEmbedding2d', 'apply_rope', 'patch_center_coords', 'rope_cos_sin',
            'rope_periods', 'rotate_half', 'SamNeck']

# ViT trunk features for DINOv2 and timm/HF ViTs (helper H5)
from .layer_scale import LayerScale  # noqa: E402
from .pos_embed_rules import (POS_EMBED_RULES, resample_pos_grid,  # noqa: E402
                              resize_abs_pos_embed)
from .swiglu import SwiGLUFFN, swiglu_hidden_dims  # noqa: E402

__all__ += ['LayerScale', 'POS_EMBED_RULES', 'resample_pos_grid', 'resize_abs_pos_embed',
            'SwiGLUFFN', 'swiglu_hidden_dims']

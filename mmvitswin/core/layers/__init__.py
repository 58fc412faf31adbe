from .attention import Attention, WindowAttention, attention
from .ffn import FFN, DropPath, drop_path_schedule
from .patch import ConvStem, PatchEmbed, PatchMerging
from .pos_embed import grid_size, resize_pos_embed, resize_rel_pos_1d, resize_rel_pos_table
from ..compat import is_tracing
from .window import (WindowPlan, blocks_window_plan, ceil_div, crop_to, effective_window,
                     merge_windows, pad_amount, partition_windows, relative_position_index,
                     shift_mask_table, to_tuple, window_partition, window_plan, window_reverse)
from .arch import linear_drop_path, resolve_arch, resolve_indices, validate_stages
from .mlp import FcNamedFFN
from .norm import LayerNorm2d, build_act, build_batch_norm, build_layer_norm, group_norm
from .stems import MaxPool2dSame, StdConv2d, pad_same, same_padding, standardize_weight
from .cosine_window import (LOGIT_SCALE_MAX, CosineWindowAttention, continuous_position_bias,
                            cpb_mlp, log_spaced_relative_coords, pretrained_window_of)

__all__ = [
    'Attention', 'WindowAttention', 'attention', 'FFN', 'DropPath', 'drop_path_schedule',
    'ConvStem', 'PatchEmbed', 'PatchMerging', 'WindowPlan', 'window_plan', 'blocks_window_plan',
    'partition_windows', 'merge_windows', 'grid_size', 'resize_pos_embed', 'resize_rel_pos_1d',
    'resize_rel_pos_table', 'is_tracing', 'ceil_div', 'crop_to', 'effective_window', 'pad_amount',
    'relative_position_index', 'shift_mask_table', 'to_tuple', 'window_partition',
    'window_reverse',
    'linear_drop_path', 'resolve_arch', 'resolve_indices', 'validate_stages', 'FcNamedFFN',
    'LayerNorm2d', 'build_act', 'build_batch_norm', 'build_layer_norm', 'group_norm',
    'MaxPool2dSame', 'StdConv2d', 'pad_same', 'same_padding', 'standardize_weight',
    'LOGIT_SCALE_MAX', 'CosineWindowAttention', 'continuous_position_bias', 'cpb_mlp',
    'log_spaced_relative_coords', 'pretrained_window_of'
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

from .attention import Attention, WindowAttention
from .ffn import FFN, DropPath, drop_path_schedule
from .linear import linear, set_onednn_linear
from .patch import ConvStem, PatchEmbed, PatchMerging
from .shifted_window import ShiftWindowMSA, shifted_window_attention
from .pos_embed import grid_size, resize_pos_embed, resize_rel_pos_1d, resize_rel_pos_table
from .window import (effective_window, pad_to_multiple, relative_position_index,
                     shift_window_mask, to_tuple, window_gather_index, window_partition,
                     window_reverse)

__all__ = [
    'Attention', 'WindowAttention', 'linear', 'set_onednn_linear', 'FFN', 'DropPath',
    'drop_path_schedule', 'ConvStem', 'PatchEmbed', 'PatchMerging', 'ShiftWindowMSA',
    'shifted_window_attention', 'grid_size', 'resize_pos_embed', 'resize_rel_pos_1d',
    'resize_rel_pos_table', 'effective_window', 'pad_to_multiple', 'relative_position_index',
    'shift_window_mask', 'window_gather_index', 'to_tuple', 'window_partition', 'window_reverse'
]

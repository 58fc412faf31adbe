"""Resizing of position embeddings and relative-position tables (checkpoint and run time)."""
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F

from ..compat import is_tracing


def resize_pos_embed(pos_embed: torch.Tensor, src_hw: Sequence[int], dst_hw: Sequence[int],
                     num_prefix_tokens: int = 0, mode: str = 'bicubic') -> torch.Tensor:
    """Resize a flattened absolute position embedding ``(1, prefix + H*W, C)`` to a new grid.

    The ``num_prefix_tokens`` leading entries (CLS, distillation tokens) are kept apart and
    untouched; the grid part is interpolated bicubically (``align_corners=False``, as timm and
    mmseg do). Returns ``(1, prefix + H'*W', C)``; the input is returned when sizes agree.
    """
    src_hw, dst_hw = tuple(src_hw), tuple(dst_hw)
    if not is_tracing() and src_hw == dst_hw:
        # (while tracing the grid is symbolic: always resample; at equal size it is exact)
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    if grid.shape[1] != src_hw[0] * src_hw[1]:
        raise ValueError(f'pos_embed has {grid.shape[1]} grid tokens, which does not match the '
                         f'source grid {src_hw}')
    c = grid.shape[-1]
    dtype = grid.dtype
    grid = grid.reshape(1, src_hw[0], src_hw[1], c).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=dst_hw, mode=mode, align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, dst_hw[0] * dst_hw[1], c).to(dtype)
    return torch.cat([prefix, grid], dim=1)


def resize_rel_pos_table(table: torch.Tensor, src_window: Sequence[int],
                         dst_window: Sequence[int]) -> torch.Tensor:
    """Resize a relative-position bias table ``(prod(2w-1), heads)`` to another window.

    2-D tables are interpolated bicubically (the Swin fine-tuning recipe for 7 -> 12); 3-D
    tables keep their temporal extent or are resized trilinearly.
    """
    src = tuple(2 * w - 1 for w in src_window)
    dst = tuple(2 * w - 1 for w in dst_window)
    if src == dst:
        return table
    rows, heads = table.shape
    expected = 1
    for s in src:
        expected *= s
    if rows != expected:
        raise ValueError(f'relative_position_bias_table has {rows} rows; a window of '
                         f'{tuple(src_window)} needs {expected}')
    mode = {1: 'linear', 2: 'bicubic', 3: 'trilinear'}[len(src)]
    grid = table.t().reshape(1, heads, *src).float()
    grid = F.interpolate(grid, size=dst, mode=mode, align_corners=False)
    return grid.reshape(heads, -1).t().to(table.dtype).contiguous()


def resize_rel_pos_1d(rel_pos: torch.Tensor, length: int) -> torch.Tensor:
    """Resize a decomposed (per-axis) relative-position table ``(L, C)`` to ``length`` rows."""
    if not is_tracing() and rel_pos.shape[0] == length:
        return rel_pos
    out = F.interpolate(rel_pos.t().unsqueeze(0).float(), size=length, mode='linear')
    return out.squeeze(0).t().to(rel_pos.dtype)


def grid_size(num_tokens: int) -> Tuple[int, int]:
    """Square grid side for a token count, or a ValueError when it is not a square."""
    side = int(round(num_tokens**0.5))
    if side * side != num_tokens:
        raise ValueError(f'cannot infer a square grid from {num_tokens} tokens')
    return side, side

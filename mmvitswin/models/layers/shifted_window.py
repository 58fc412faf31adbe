"""(Shifted-)window multi-head self-attention on channels-last N-D inputs.

Shared by the 2-D Swin (windows of ``(Wh, Ww)``) and the video Swin (``(Wt, Wh, Ww)``).
"""
from typing import Optional, Sequence

import torch
import torch.nn as nn

from .attention import WindowAttention
from .window import (effective_window, pad_to_multiple, shift_window_mask, window_partition,
                     window_reverse)


class ShiftWindowMSA(nn.Module):
    """W-MSA (``shift`` all zero) or SW-MSA over ``x: (B, *spatial, C)``.

    Steps: pad each spatial dim to a multiple of the window (end of the dim), roll by
    ``-shift``, attend inside windows with the relative position bias and the cached shift mask,
    roll back, crop the padding. The pad comes **before** the shift, as in mmdet/mmseg/mmaction2.

    ``clamp_to_input``: shrink the window (and drop the shift) along dims where the input is not
    larger than the window, as the video Swin does; the 2-D Swin keeps mmdet's full windows.
    The attention module is ``w_msa`` so checkpoint keys match mmdet/mmseg.
    """

    def __init__(self, embed_dims: int, num_heads: int, window: Sequence[int],
                 shift: Sequence[int], qkv_bias: bool = True, qk_scale: Optional[float] = None,
                 attn_drop: float = 0., proj_drop: float = 0., clamp_to_input: bool = False,
                 use_sdpa: bool = True):
        super().__init__()
        self.window = tuple(window)
        self.shift = tuple(shift)
        if any(not 0 <= s < w for s, w in zip(self.shift, self.window)):
            raise ValueError(f'shift {self.shift} must lie in [0, window) for window {self.window}')
        self.clamp_to_input = clamp_to_input
        self.w_msa = WindowAttention(embed_dims, num_heads, self.window, qkv_bias=qkv_bias,
                                     qk_scale=qk_scale, attn_drop=attn_drop,
                                     proj_drop=proj_drop, use_sdpa=use_sdpa)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spatial = tuple(x.shape[1:-1])
        window, shift = self.window, self.shift
        if self.clamp_to_input:
            window, shift = effective_window(spatial, window, shift)
        x, padded = pad_to_multiple(x, window)
        dims = tuple(range(1, len(window) + 1))
        mask = None
        if any(shift):
            x = torch.roll(x, shifts=tuple(-s for s in shift), dims=dims)
            mask = shift_window_mask(padded, window, shift, x.device, x.dtype)
        windows = self.w_msa(window_partition(x, window), mask)
        x = window_reverse(windows, window, padded)
        if any(shift):
            x = torch.roll(x, shifts=shift, dims=dims)
        if padded != spatial:
            x = x[(slice(None), ) + tuple(slice(0, s) for s in spatial)]
        return x

"""(Shifted-)window multi-head self-attention on channels-last N-D inputs.

Shared by the 2-D Swin (windows of ``(Wh, Ww)``) and the video Swin (``(Wt, Wh, Ww)``).
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .attention import WindowAttention
from .switch import is_tracing
from .window import ceil_div, effective_window, shift_window_mask, window_gather_index


def shifted_window_attention(x: torch.Tensor, attn: WindowAttention, window: Tuple[int, ...],
                             shift: Tuple[int, ...], clamp_to_input: bool = False) -> torch.Tensor:
    """(S)W-MSA of ``x: (B, *spatial, C)`` with the window attention module ``attn``.

    Semantics: pad each spatial dim to a multiple of the window (end of the dim), roll by
    ``-shift``, attend inside windows with the relative position bias and the shift mask,
    roll back, crop the padding. The pad comes **before** the shift, as in mmdet/mmseg/mmaction2.
    The pad/roll/partition chain runs as one gather each way (``window_gather_index``); the
    indices and the mask are recomputed from the sizes on every call (a few small integer
    ops), so nothing is cached and every size traces the same way.

    ``clamp_to_input``: shrink the window (and drop the shift) along dims where the input is not
    larger than the window, as the video Swin does; the 2-D Swin keeps mmdet's full windows.
    A free function so that backbones whose checkpoints name the attention differently
    (mmdet ``attn.w_msa``, mmaction2 ``attn``) share it.
    """
    spatial = tuple(x.shape[1:-1])
    if clamp_to_input:
        window, shift = effective_window(spatial, window, shift)
    b, c = x.shape[0], x.shape[-1]
    n = 1
    for w in window:
        n *= w
    gather, valid, scatter = window_gather_index(spatial, window, shift, x.device)
    windows = x.reshape(b, -1, c).index_select(1, gather)
    padded = tuple(ceil_div(s, w) * w for s, w in zip(spatial, window))
    if is_tracing() or padded != spatial:
        windows = windows.masked_fill(~valid[:, None], 0.)
    mask = shift_window_mask(padded, window, shift, x.device) if any(shift) else None
    out = attn(windows.view(-1, n, c), mask)
    return out.view(b, -1, c).index_select(1, scatter).view(x.shape)


class ShiftWindowMSA(nn.Module):
    """W-MSA (``shift`` all zero) or SW-MSA over ``x: (B, *spatial, C)``; see
    :func:`shifted_window_attention`. The attention module is ``w_msa`` so checkpoint keys match
    mmdet/mmseg.
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
        return shifted_window_attention(x, self.w_msa, self.window, self.shift,
                                        self.clamp_to_input)

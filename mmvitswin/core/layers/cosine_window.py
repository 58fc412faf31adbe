"""Swin V2 window attention: scaled cosine attention with a log-spaced continuous position bias.

- :func:`log_spaced_relative_coords`: the ``(prod(2w - 1), 2)`` offsets the position-bias MLP
  reads, ``sign(d) * log2(1 + 8 |d| / (p - 1)) / 3`` per axis, ``p`` the *pretrained* window
  (the window the MLP was trained at) or, without one, the window. Keeping ``p`` while the
  window grows is how a window-8 checkpoint runs at window 16 or 24: no table is resampled.
- :class:`CosineWindowAttention`: ``softmax(cos(q, k) * exp(min(logit_scale, log 100)) +
  16 sigmoid(cpb_mlp(coords)) + mask) v`` inside windows. The projection has no bias of its
  own but ``q_bias`` and ``v_bias`` (no key bias), as every released Swin V2.
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..compat import autocast_off
from .attention import WindowAttention, window_heads

__all__ = ['LOGIT_SCALE_MAX', 'log_spaced_relative_coords', 'pretrained_window_of', 'cpb_mlp',
           'continuous_position_bias', 'CosineWindowAttention']

#: Upper clamp of the learnt per-head logit scale (the paper's ``log(1 / 0.01)``: at most 100).
LOGIT_SCALE_MAX = math.log(1. / 0.01)


def log_spaced_relative_coords(window: Sequence[int],
                               pretrained_window: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Log-spaced relative coordinates ``(prod(2 w_i - 1), ndim)`` float32, rows in the order
    of :func:`~.window.relative_position_index` (row-major over the offsets).

    Offsets ``d`` in ``[-(w - 1), w - 1]`` per axis are scaled so that ``|d| = p - 1`` maps to
    8 (``p``: ``pretrained_window`` where given and > 0, else ``window``; a window of 1 has
    only offset 0), then ``sign * log2(1 + |.|) / log2(8)``.
    """
    window = tuple(window)
    ref = tuple(pretrained_window) if pretrained_window is not None else (0, ) * len(window)
    axes = [torch.arange(-(w - 1), w, dtype=torch.float32) for w in window]
    coords = torch.stack(torch.meshgrid(*axes, indexing='ij'), dim=-1).reshape(-1, len(window))
    span = torch.tensor([max((p if p > 0 else w) - 1, 1) for w, p in zip(window, ref)],
                        dtype=torch.float32)
    coords = coords * (8. / span)
    return torch.sign(coords) * torch.log2(coords.abs() + 1.) / math.log2(8)


def cpb_mlp(num_heads: int, hidden_dims: int = 512) -> nn.Sequential:
    """The position-bias MLP ``2 -> hidden -> heads`` (ReLU, no output bias): indices 0 and 2
    are the released checkpoints' ``cpb_mlp.0`` / ``cpb_mlp.2``."""
    return nn.Sequential(nn.Linear(2, hidden_dims), nn.ReLU(inplace=True),
                         nn.Linear(hidden_dims, num_heads, bias=False))


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in fp32 where it is in a 16-bit float type, else as it is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def continuous_position_bias(mlp: nn.Module, coords: torch.Tensor) -> torch.Tensor:
    """``16 * sigmoid(mlp(coords))``: the ``(rows, heads)`` bias table, at least in fp32, also
    under autocast (the bias is small and bounded; low precision would round it)."""
    with autocast_off(coords.device.type):
        return 16. * torch.sigmoid(at_least_fp32(mlp(coords)))


class CosineWindowAttention(WindowAttention):
    """Swin V2 attention inside windows of ``window`` tokens (see the module docstring).

    Parameters (mmpretrain's ``WindowMSAV2`` / Microsoft's names): ``qkv.weight`` (no bias),
    ``q_bias``, ``v_bias`` (with ``qkv_bias``), ``logit_scale`` ``(heads, 1, 1)``, ``cpb_mlp``,
    ``proj``. Buffers (derived, not saved): ``relative_coords_table`` and
    ``relative_position_index``, rebuilt from ``window`` / ``pretrained_window``.

    ``forward(x: (B, *spatial, C), plan)`` as :class:`~.attention.WindowAttention`.
    """

    def __init__(self, dim: int, num_heads: int, window: Sequence[int],
                 pretrained_window: Optional[Sequence[int]] = None, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0., cpb_hidden_dims: int = 512,
                 fused_attn: bool = True):
        # the cosine logits carry their own learnt scale: the product is not rescaled
        super().__init__(dim, num_heads, window, qkv_bias=False, qk_scale=1.,
                         attn_drop=attn_drop, proj_drop=proj_drop, fused_attn=fused_attn,
                         position_table=False)
        self.pretrained_window = (tuple(pretrained_window) if pretrained_window is not None
                                  else (0, ) * len(self.window))
        if qkv_bias:
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = self.v_bias = None
        self.logit_scale = nn.Parameter(torch.full((num_heads, 1, 1), math.log(10.)))
        self.cpb_mlp = cpb_mlp(num_heads, cpb_hidden_dims)
        self.register_buffer('relative_coords_table',
                             log_spaced_relative_coords(self.window, self.pretrained_window),
                             persistent=False)

    def qkv_bias(self) -> Optional[torch.Tensor]:
        """``[q_bias, 0, v_bias]`` (the key has no bias), or None."""
        if self.q_bias is None:
            return None
        return torch.cat([self.q_bias, torch.zeros_like(self.v_bias), self.v_bias])

    def position_bias(self, n: int) -> torch.Tensor:
        """The continuous position bias ``(heads, n, n)`` as the attention adds it, at least
        fp32: ``16 sigmoid(.) - 8`` rather than ``16 sigmoid(.)``, the same attention (softmax
        cancels a constant), and a bias centred on 0 rounds to bf16 with half the error."""
        table = continuous_position_bias(self.cpb_mlp, self.relative_coords_table) - 8.
        return self.gather_bias(table, n)

    def attend_windows(self, windows: torch.Tensor, mask: Optional[torch.Tensor]):
        nw = 1 if mask is None else mask.shape[0]
        qk, v = window_heads(windows, nw, self.num_heads).split((2, 1))
        # q and k as unit vectors, at least in fp32: a padding key is 0, whose normalisation
        # (and its gradient, 1 / eps) stays finite there
        q, k = F.normalize(at_least_fp32(qk), dim=-1).unbind(0)
        v = v.squeeze(0)
        scale = self.logit_scale.clamp(max=LOGIT_SCALE_MAX).exp()  # (heads, 1, 1)
        q = (q.unflatten(1, (nw, self.num_heads)) * scale).flatten(1, 2)
        bias = self.position_bias(windows.shape[1])
        if mask is not None:
            bias = bias + mask[:, None]
        return self.attend(q.to(v.dtype), k.to(v.dtype), v,
                           bias.reshape(1, -1, *bias.shape[-2:]), scale=1.)


def pretrained_window_of(table: torch.Tensor) -> Tuple[int, ...]:
    """The window ``p`` a saved ``relative_coords_table`` was normalised to (its offset 1 along
    each axis reads ``log2(1 + 8 / (p - 1)) / 3``); 0 along an axis of window 1 (no offsets).

    ``table``: ``(1, 2w_0 - 1, 2w_1 - 1, 2)`` as Microsoft/mmpretrain save it, or ``(rows, 2)``
    with the window given by the rows (square).
    """
    grid = table.reshape(table.shape[-3], table.shape[-2], 2).float() if table.dim() >= 3 else \
        table.float().reshape(int(round(table.shape[0]**0.5)), -1, 2)
    out = []
    for axis in range(2):
        if grid.shape[axis] < 3:
            out.append(0)
            continue
        centre = [(grid.shape[0] - 1) // 2, (grid.shape[1] - 1) // 2]
        centre[axis] += 1
        value = float(grid[centre[0], centre[1], axis])
        out.append(int(round(8. / (2.**(3. * value) - 1.) + 1.)))
    return tuple(out)

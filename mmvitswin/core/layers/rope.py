"""2-D rotary position embedding (RoPE) of DINOv3, in its evaluation behaviour.

The rule (Meta's DINOv3 ``RopePositionEmbedding`` with ``normalize_coords='separate'``, as
HF ``transformers``' ``DINOv3ViTModel`` computes it in eval mode):

- Each patch ``(i, j)`` of an ``h x w`` grid gets the coordinates of its centre normalised per
  axis to ``[-1, 1]``: ``y = 2 (i + 0.5) / h - 1``, ``x = 2 (j + 0.5) / w - 1``. Every grid spans
  the same range, so any input size (square or not) is "in distribution" for the rotation.
- A head of ``D`` channels has ``D / 4`` frequencies ``1 / period_k`` with
  ``period_k = theta ** (4 k / D)`` (``theta = rope_theta``, 100 for the released models).
  The angle of frequency ``k`` on axis ``a`` is ``2 pi * coord_a / period_k``; the ``D / 2``
  angles ``[y-angles, x-angles]`` are repeated twice to ``D`` and applied in the
  "rotate-half" layout: ``x * cos + rotate_half(x) * sin``.
- Only patch tokens are rotated: the CLS and register (storage) tokens in front keep q and k
  as projected.
- Training-only augmentation (random shift / jitter / rescale of the coordinates,
  ``pos_embed_rescale=2`` in HF's config) is not applied: these are features for fine-tuning
  and inference, and the evaluation rule is what the released weights produce.

Pure functions first (traceable: no Python loops over shapes, no ``.item()``), then the module.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn

__all__ = ['rope_periods', 'patch_center_coords', 'rope_cos_sin', 'rotate_half',
           'apply_rope', 'RotaryPositionEmbedding2d']


def rope_periods(head_dim: int, theta: float = 100.0) -> torch.Tensor:
    """The ``head_dim // 4`` periods ``theta ** (4 k / head_dim)`` (float32), ``k = 0..``.

    ``head_dim`` must be a multiple of 4 (two axes, each rotated in pairs of channels)."""
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0 \
            or head_dim % 4:
        raise ValueError(f'head_dim must be a positive multiple of 4 for 2-D RoPE, got '
                         f'{head_dim!r}')
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not theta > 0:
        raise ValueError(f'rope theta must be a positive number, got {theta!r}')
    # the exponents 0, 4/D, 8/D, ... as HF computes them (an arange with that step, float32),
    # so the periods agree bit for bit; sliced in case rounding adds an end point
    exponent = torch.arange(0, 1, 4 / head_dim, dtype=torch.float32)[:head_dim // 4]
    return float(theta)**exponent


def patch_center_coords(grid: Tuple[int, int], device: Optional[torch.device] = None,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Patch-centre coordinates of an ``(h, w)`` grid, each axis normalised to ``[-1, 1]``.

    Returns ``(h * w, 2)`` rows ``(y, x)`` in row-major grid order."""
    h, w = grid
    ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) / h
    xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) / w
    coords = torch.stack(torch.meshgrid(ys, xs, indexing='ij'), dim=-1).reshape(-1, 2)
    return 2.0 * coords - 1.0


def rope_cos_sin(grid: Tuple[int, int], periods: torch.Tensor) -> Tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """``(cos, sin)``, each ``(h * w, 4 * len(periods))``, for the patch tokens of ``grid``.

    Computed in float32 (``periods``' device); cast to the q/k dtype by :func:`apply_rope`."""
    coords = patch_center_coords(grid, periods.device, torch.float32)  # (N, 2)
    inv_freq = 1.0 / periods.float()
    angles = (2 * math.pi) * coords[:, :, None] * inv_freq[None, None, :]  # (N, 2, D/4)
    angles = angles.flatten(1).repeat(1, 2)  # (N, D): [y, x, y, x] blocks of D/4
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dim (halves of equal size)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               num_prefix: int = 0) -> torch.Tensor:
    """Rotate the patch tokens of ``x: (..., num_prefix + N, head_dim)``.

    ``cos, sin: (N, head_dim)`` from :func:`rope_cos_sin`; the first ``num_prefix`` tokens (CLS,
    registers) are returned unchanged. Output: same shape and dtype as ``x``."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if num_prefix == 0:
        return x * cos + rotate_half(x) * sin
    prefix, patches = x[..., :num_prefix, :], x[..., num_prefix:, :]
    patches = patches * cos + rotate_half(patches) * sin
    return torch.cat([prefix, patches], dim=-2)


class RotaryPositionEmbedding2d(nn.Module):
    """DINOv3's 2-D RoPE for heads of ``head_dim`` channels (see module docstring).

    ``forward(grid) -> (cos, sin)``, each ``(h * w, head_dim)`` float32, for any grid; the
    attention applies them with :func:`apply_rope` to q and k of the patch tokens. ``periods``
    is a non-persistent buffer derived from ``(head_dim, theta)``: a checkpoint's stored periods
    (Meta's ``rope_embed.periods``) are checked against it, never loaded.
    """

    periods: torch.Tensor

    def __init__(self, head_dim: int, theta: float = 100.0):
        super().__init__()
        self.head_dim = head_dim
        self.theta = float(theta)
        self.register_buffer('periods', rope_periods(head_dim, theta), persistent=False)

    def forward(self, grid: Tuple[int, int]) -> Tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(grid, self.periods)

    def extra_repr(self) -> str:
        return f'head_dim={self.head_dim}, theta={self.theta:g}'

"""Absolute position-embedding resizing by the rule of the implementation weights came from.

A ViT's learned grid of position embeddings is resampled to every input grid (at run time) and
to the model's pretraining grid (on loading). Implementations differ in how, and features off
the pretraining grid differ with them (plain vs antialiased bicubic: 1e-2 to 0.18 relative at
333 x 257), so the rule is part of a checkpoint's format:

========================== ================================================================
rule                       implementation
========================== ================================================================
``'bicubic'``              mmseg/mmpretrain ``VisionTransformer``, HF ``ViTModel``, HF
                           ``Dinov2Model``: ``F.interpolate(size=grid, mode='bicubic')``
``'bicubic-antialias'``    timm (``resample_abs_pos_embed``), HF ``Dinov2WithRegistersModel``,
                           Meta's DINOv2 with registers: the same with ``antialias=True``
                           (computed as its two per-axis weight matrices: same values, and
                           its backward traces with symbolic sizes, which PyTorch's
                           antialiased kernel's does not)
``'bicubic-offset'``       Meta's DINOv2 without registers (``interpolate_offset=0.1``):
                           ``scale_factor=(grid + 0.1) / src``, so the sampling positions
                           follow that scale rather than ``src / grid`` (computed as a
                           bicubic ``grid_sample`` at those positions: same values, and
                           ``torch.compile`` does not specialise on the size)
``'bilinear'``             ``interpolate_mode='bilinear'`` of mmseg
========================== ================================================================
"""
from typing import Sequence

import torch
import torch.nn.functional as F

from ..compat import is_tracing

POS_EMBED_RULES = ('bicubic', 'bicubic-antialias', 'bicubic-offset', 'bilinear')
DINOV2_OFFSET = 0.1


def resample_pos_grid(grid: torch.Tensor, dst_hw: Sequence[int], rule: str) -> torch.Tensor:
    """``grid: (1, C, h, w)`` position embeddings -> ``(1, C, *dst_hw)`` by ``rule``
    (module docstring); computed in fp32 (bicubic in half precision shifts the values)."""
    if rule not in POS_EMBED_RULES:
        raise ValueError(f'pos-embed resize rule must be one of {POS_EMBED_RULES}, got {rule!r}')
    dtype = grid.dtype
    grid = grid.float()
    if rule == 'bicubic-offset':
        out = _bicubic_offset(grid, dst_hw)
    elif rule == 'bicubic-antialias':
        src_h, src_w = grid.shape[-2:]
        rows = _antialiased_bicubic_weights(dst_hw[0], src_h, grid.device)
        cols = _antialiased_bicubic_weights(dst_hw[1], src_w, grid.device)
        out = rows @ grid @ cols.T
    else:
        mode = 'bilinear' if rule == 'bilinear' else 'bicubic'
        out = F.interpolate(grid, size=tuple(dst_hw), mode=mode, align_corners=False)
    return out.to(dtype)


def _antialiased_bicubic_weights(n: int, m: int, device=None) -> torch.Tensor:
    """``(n, m)``: row ``j`` holds the weights output cell ``j`` of a length-``n`` axis gives
    the ``m`` source cells in ``F.interpolate(mode='bicubic', antialias=True,
    align_corners=False)``. The cell's centre sits at source position ``(j + 0.5) * m / n``;
    the cubic kernel (``a = -0.5``, as PIL's) is stretched by the downscale factor (by 1 when
    upscaling), cut at the image's edges and normalised to sum 1. The scale is a tensor, so
    a traced graph holds for every size (no branch on up- or downscaling)."""
    scale = torch.full((), m, dtype=torch.float32, device=device) / n
    stretch = scale.clamp(min=1)
    centre = (torch.arange(n, dtype=torch.float32, device=device)[:, None] + 0.5) * scale
    source = torch.arange(m, dtype=torch.float32, device=device) + 0.5
    x = ((source - centre) / stretch).abs()
    a = -0.5
    near = ((a + 2) * x - (a + 3)) * x * x + 1  # |x| < 1
    far = (((x - 5) * x + 8) * x - 4) * a  # 1 <= |x| < 2
    weights = torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))
    return weights / weights.sum(-1, keepdim=True)


def _bicubic_offset(grid: torch.Tensor, dst_hw: Sequence[int]) -> torch.Tensor:
    """Meta's ``F.interpolate(grid, scale_factor=(n + 0.1) / M, mode='bicubic')``: output
    cell ``j`` reads source position ``(j + 0.5) * M / (n + 0.1) - 0.5``. Written as a
    bicubic ``grid_sample`` at those positions (border-clamped taps, as ``interpolate``
    clamps them), so the scale is a tensor, not a Python float that ``torch.compile`` would
    specialise on for every input size."""
    src_h, src_w = grid.shape[-2:]

    def axis(n, m):  # grid_sample's normalised coordinate of each output cell's source
        j = torch.arange(n, dtype=torch.float32, device=grid.device)
        src = (j + 0.5) * (m / (n + DINOV2_OFFSET)) - 0.5
        return (2 * src + 1) / m - 1

    gy, gx = torch.meshgrid(axis(dst_hw[0], src_h), axis(dst_hw[1], src_w), indexing='ij')
    coords = torch.stack((gx, gy), dim=-1)[None]
    return F.grid_sample(grid, coords, mode='bicubic', padding_mode='border',
                         align_corners=False)


def resize_abs_pos_embed(pos_embed: torch.Tensor, src_hw: Sequence[int], dst_hw: Sequence[int],
                         rule: str = 'bicubic') -> torch.Tensor:
    """Flattened grid embeddings ``(1, h*w, C)`` of the ``src_hw`` grid -> ``(1, H'*W', C)``
    of ``dst_hw`` by ``rule``; the input itself when the grids agree (outside tracing: there
    the grid is symbolic, so it always resamples, exactly at equal size)."""
    src_hw, dst_hw = tuple(src_hw), tuple(dst_hw)
    if not is_tracing() and src_hw == dst_hw:
        return pos_embed
    n, c = pos_embed.shape[1], pos_embed.shape[2]
    if n != src_hw[0] * src_hw[1]:
        raise ValueError(f'pos_embed has {n} grid tokens, which does not match the source '
                         f'grid {src_hw}')
    grid = pos_embed.reshape(1, src_hw[0], src_hw[1], c).permute(0, 3, 1, 2)
    out = resample_pos_grid(grid, dst_hw, rule)
    return out.permute(0, 2, 3, 1).reshape(1, -1, c)

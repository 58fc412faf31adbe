"""Patch embedding (2-D/3-D, corner padding) and Swin patch merging."""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..compat import is_tracing
from .window import end_pads, pad_amount, to_tuple


class PatchEmbed(nn.Module):
    """Non-overlapping patch embedding for images ``(B, C, H, W)`` or clips ``(B, C, T, H, W)``.

    The input is zero-padded at the bottom/right (and end of time) to a multiple of the patch
    ("corner" padding, as mmdet's AdaptivePadding), so any size works and the output grid is
    ``ceil(size / patch)``. Returns channels-last tokens ``(B, *grid, embed_dims)`` and the grid.

    ``proj_name`` names the conv submodule (mmdet: ``projection``; mmaction2/timm: ``proj``) so
    state-dict keys match the checkpoints of each family without renaming.
    """

    def __init__(self, in_channels: int = 3, embed_dims: int = 96,
                 patch_size: Sequence[int] = (4, 4), norm: bool = True,
                 proj_name: str = 'projection', bias: bool = True):
        super().__init__()
        self.patch_size = tuple(patch_size)
        conv = {2: nn.Conv2d, 3: nn.Conv3d}[len(self.patch_size)]
        self.proj_name = proj_name
        self.add_module(proj_name, conv(in_channels, embed_dims, kernel_size=self.patch_size,
                                        stride=self.patch_size, bias=bias))
        self.norm = nn.LayerNorm(embed_dims) if norm else None

    @property
    def conv(self) -> nn.Module:
        return getattr(self, self.proj_name)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, ...]]:
        spatial = x.shape[2:]
        pads = [pad_amount(s, p) for s, p in zip(spatial, self.patch_size)]
        if is_tracing() or any(p != 0 for p in pads):  # a traced size may need padding
            x = F.pad(x, end_pads(pads))
        x = self.conv(x)
        grid = tuple(x.shape[2:])
        x = x.flatten(2).transpose(1, 2)
        if self.norm is not None:
            x = self.norm(x)
        return x.reshape(x.shape[0], *grid, x.shape[-1]), grid


class ConvStem(nn.Module):
    """Convolutional patch embedding ("Early convolutions help transformers see better",
    Xiao et al. 2021): ``log2(patch)`` 3x3 stride-2 convs with BatchNorm + ReLU, the channels
    doubling up to ``embed_dims // 2`` at the last one, then a 1x1 conv to ``embed_dims``.

    Same interface as :class:`PatchEmbed` for images: ``(B, C, H, W)`` -> tokens
    ``(B, h, w, embed_dims)`` and ``(h, w) = ceil((H, W) / patch)`` (each conv pads 1), so any
    size works. The 1x1 conv is ``proj`` (a ViT's ``patch_embed.proj`` key; a checkpoint's
    patchify kernel does not fit it and is not loaded, with a warning). The paper reports faster,
    more stable optimisation than a patchify stem for ViTs trained from scratch.
    """

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int):
        super().__init__()
        if patch_size < 2 or patch_size & (patch_size - 1):
            raise ValueError(f'a conv stem needs patch_size to be a power of two >= 2, got '
                             f'{patch_size}')
        num_convs = patch_size.bit_length() - 1
        if embed_dims % 2**num_convs:
            raise ValueError(f'a conv stem with patch_size {patch_size} needs embed_dims '
                             f'divisible by {2**num_convs}, got {embed_dims}')
        self.patch_size = (patch_size, patch_size)
        layers, c_in = [], in_channels
        for i in range(num_convs):
            c_out = embed_dims // 2**(num_convs - i)
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
            c_in = c_out
        self.stem = nn.Sequential(*layers)
        self.proj = nn.Conv2d(c_in, embed_dims, 1)
        self.norm = None

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.proj(self.stem(x))
        grid = (x.shape[2], x.shape[3])
        return x.permute(0, 2, 3, 1), grid


def _pad_end(x: torch.Tensor, dim: int, amount) -> torch.Tensor:
    """Zero-pad the end of axis ``dim`` (negative: counted from the last) by ``amount``."""
    return F.pad(x, (0, 0) * (-dim - 1) + (0, amount))


def _neighbour_pairs(x: torch.Tensor, dim: int, stride: int) -> torch.Tensor:
    """Split axis ``dim`` (negative) of size ``n`` into ``(ceil(n / stride), 2)``: window ``i``
    holds rows ``i * stride`` and ``i * stride + 1``, zeros past the end (mmdet's
    ``nn.Unfold(kernel_size=2, stride=stride)`` after corner padding)."""
    size = x.shape[dim]
    if stride == 1:  # overlapping windows: every row and the next one
        x = _pad_end(x, dim, 1)
        return torch.stack((x.narrow(dim, 0, size), x.narrow(dim, 1, size)), dim)
    # padded to a multiple of the stride, each window's first two rows
    x = _pad_end(x, dim, pad_amount(size, stride))
    return x.unflatten(dim, (x.shape[dim] // stride, stride)).narrow(dim, 0, 2)


class PatchMerging(nn.Module):
    """Merge each 2x2 neighbourhood into one token and project 4C -> out_channels.

    ``stride`` (an int or ``(sh, sw)``): the step between neighbourhoods, as mmdet's/mmseg's
    ``PatchMerging`` (``nn.Unfold(kernel_size=2, stride=stride)`` after "corner" zero
    padding). Output size per axis: ``ceil(size / stride)``: 2 (Swin's default) halves it,
    padding odd sizes by one row at the bottom/right; 1 keeps it (overlapping windows, one
    zero row/column added); ``s > 2`` takes the first two rows of every ``s``.
    ``channel_order`` fixes how the 2x2 neighbours are laid out in the 4C vector, which is what
    the weights of ``reduction`` were trained against:

    - ``'unfold'`` (mmdet/mmseg): channel-major, ``[c, dy, dx]`` (``nn.Unfold`` order);
    - ``'microsoft'`` (Microsoft, timm, mmaction2): neighbour-major, ``[(0,0), (1,0), (0,1),
      (1,1)][k] * C + c``.

    Input and output are channels-last: ``(B, ..., H, W, C) -> (B, ..., H', W', out)``.
    ``norm_after``: Swin V2's order, ``norm(reduction(x))`` with the norm over ``out_channels``
    (V1: ``reduction(norm(x))``, the norm over the 4C merged channels).
    """

    def __init__(self, in_channels: int, out_channels: Optional[int] = None,
                 stride=2, channel_order: str = 'unfold', norm_after: bool = False):
        super().__init__()
        if channel_order not in ('unfold', 'microsoft'):
            raise ValueError(f"channel_order must be 'unfold' or 'microsoft', got "
                             f'{channel_order!r}')
        self.stride = to_tuple(stride, 2, 'stride')
        out_channels = out_channels or 2 * in_channels
        self.channel_order = channel_order
        self.norm_after = norm_after
        self.norm = nn.LayerNorm(out_channels if norm_after else 4 * in_channels)
        self.reduction = nn.Linear(4 * in_channels, out_channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, h, w, c = x.shape
        if self.stride == (2, 2):  # one pad and one view
            pad_h, pad_w = pad_amount(h, 2), pad_amount(w, 2)
            if is_tracing() or pad_h or pad_w:  # no size-dependent branch while tracing
                x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
                h, w = h + pad_h, w + pad_w
            x = x.reshape(*lead, h // 2, 2, w // 2, 2, c)
        else:
            x = _neighbour_pairs(_neighbour_pairs(x, -3, self.stride[0]), -2, self.stride[1])
        oh, ow = x.shape[-5], x.shape[-3]
        nl = len(lead)
        hdim, dy, wdim, dx, cdim = nl, nl + 1, nl + 2, nl + 3, nl + 4
        # the merged vector's layout, which ``reduction`` was trained against
        order = (dx, dy, cdim) if self.channel_order == 'microsoft' else (cdim, dy, dx)
        x = x.permute(*range(nl), hdim, wdim, *order).reshape(*lead, oh, ow, 4 * c)
        if self.norm_after:
            return self.norm(self.reduction(x))
        return self.reduction(self.norm(x))

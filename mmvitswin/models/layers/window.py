"""Window helpers shared by the 2-D and 3-D Swin and the windowed ViT blocks.

Every function works on channels-last tensors ``(B, *spatial, C)`` with any number of spatial
dimensions (2 for images, 3 for video), so the image and video backbones share one code path.
"""
from functools import lru_cache
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F

Size = Tuple[int, ...]


def to_tuple(value, ndim: int, name: str) -> Size:
    """Expand an int to ``ndim`` ints, or validate a sequence of ``ndim`` positive ints."""
    if isinstance(value, bool):
        raise TypeError(f'{name} must be an int or a sequence of {ndim} ints, got {value!r}')
    if isinstance(value, int):
        out = (value, ) * ndim
    elif isinstance(value, Sequence) and len(value) == ndim and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        out = tuple(value)
    else:
        raise TypeError(f'{name} must be an int or a sequence of {ndim} ints, got {value!r}')
    if min(out) < 1:
        raise ValueError(f'{name} must be >= 1, got {value!r}')
    return out


def pad_to_multiple(x: torch.Tensor, multiple: Size) -> Tuple[torch.Tensor, Size]:
    """Zero-pad the spatial dims of ``x: (B, *spatial, C)`` at their end up to ``multiple``.

    Returns the padded tensor and its padded spatial size.
    """
    spatial = x.shape[1:-1]
    pads = [(-s) % m for s, m in zip(spatial, multiple)]
    if any(pads):
        # F.pad lists pads from the last dim backwards: channels first (none), then spatial.
        flat = [0, 0]
        for p in reversed(pads):
            flat += [0, p]
        x = F.pad(x, flat)
    return x, tuple(s + p for s, p in zip(spatial, pads))


def window_partition(x: torch.Tensor, window: Size) -> torch.Tensor:
    """Split ``x: (B, *spatial, C)`` into windows ``(B * num_windows, prod(window), C)``.

    Each spatial dim must be a multiple of its window size. Windows are ordered
    row-major over the window grid, batch outermost (as in every reference Swin).
    """
    b, c = x.shape[0], x.shape[-1]
    spatial = x.shape[1:-1]
    nd = len(window)
    shape = [b]
    for s, w in zip(spatial, window):
        shape += [s // w, w]
    x = x.view(*shape, c)
    grid_dims = [1 + 2 * i for i in range(nd)]
    win_dims = [2 + 2 * i for i in range(nd)]
    x = x.permute(0, *grid_dims, *win_dims, 2 * nd + 1)
    numel = 1
    for w in window:
        numel *= w
    return x.reshape(-1, numel, c)


def window_reverse(windows: torch.Tensor, window: Size, spatial: Size) -> torch.Tensor:
    """Inverse of :func:`window_partition`: ``(B * nW, prod(window), C) -> (B, *spatial, C)``."""
    c = windows.shape[-1]
    nd = len(window)
    grid = [s // w for s, w in zip(spatial, window)]
    x = windows.view(-1, *grid, *window, c)
    order = [0]
    for i in range(nd):
        order += [1 + i, 1 + nd + i]
    x = x.permute(*order, 2 * nd + 1)
    return x.reshape(x.shape[0], *spatial, c)


def relative_position_index(window: Size) -> torch.Tensor:
    """Index into a ``prod(2w - 1)``-row relative-position table for every token pair.

    For tokens ``a`` and ``b`` inside one window the index is the row-major position of the
    offset ``a - b`` in a table of shape ``(2w_0 - 1, 2w_1 - 1, ...)``. Returns ``(N, N)`` long,
    ``N = prod(window)``; the same indexing the Microsoft, mmdet and mmaction2 Swins use.
    """
    axes = [torch.arange(w) for w in window]
    coords = torch.stack(torch.meshgrid(*axes, indexing='ij')).flatten(1)  # (nd, N)
    rel = coords[:, :, None] - coords[:, None, :]  # (nd, N, N)
    index = torch.zeros(rel.shape[1:], dtype=torch.long)
    stride = 1
    for d in reversed(range(len(window))):
        index += (rel[d] + window[d] - 1) * stride
        stride *= 2 * window[d] - 1
    return index


@lru_cache(maxsize=64)
def shift_window_mask(padded: Size, window: Size, shift: Size, device: torch.device,
                      dtype: torch.dtype, fill: float = -100.0) -> torch.Tensor:
    """Additive attention mask for shifted windows, cached per (size, window, shift, device, dtype).

    After a cyclic shift by ``-shift`` some windows hold tokens from different image regions;
    pairs from different regions get ``fill`` (the references use -100, not -inf, and we keep
    it to reproduce their numbers). Returns ``(num_windows, N, N)``. Padded tokens are not
    masked, matching mmdet/mmseg/mmaction2. The result must be treated as read-only.
    """
    label = torch.zeros((1, *padded, 1))
    region_slices = [((0, -w), (-w, -s), (-s, None)) if s > 0 else ((0, None), )
                     for w, s in zip(window, shift)]
    count = 0
    for combo in _product(region_slices):
        index = (slice(None), ) + tuple(slice(a, b) for a, b in combo) + (slice(None), )
        label[index] = count
        count += 1
    labels = window_partition(label, window).squeeze(-1)  # (nW, N)
    diff = labels[:, None, :] - labels[:, :, None]
    mask = torch.zeros(diff.shape).masked_fill(diff != 0, fill)
    return mask.to(device=device, dtype=dtype)


@lru_cache(maxsize=128)
def window_gather_index(spatial: Size, window: Size, shift: Size, device: torch.device):
    """Indices that take a flattened input straight to padded, shifted windows and back.

    Equivalent to ``pad_to_multiple -> roll(-shift) -> window_partition`` (and the inverse with
    the crop), but as one gather each way instead of a chain of copies. For ``x: (B, L, C)``
    with ``L = prod(spatial)``:

    - ``gather`` ``(nW * N,)``: ``x[:, gather]`` lists the tokens window by window; entries that
      fall into padding point at token 0 and are listed in ``pad``;
    - ``pad`` ``(P,)`` or None: positions (in window order) to zero, as the padding would be;
    - ``scatter`` ``(L,)``: ``windows[:, scatter]`` puts every real token back in place.
    """
    padded = tuple(-(-s // w) * w for s, w in zip(spatial, window))
    # After rolling by -shift, rolled position p holds padded position (p + shift) % P.
    axes = [(torch.arange(p) + h) % p for p, h in zip(padded, shift)]
    grids = torch.meshgrid(*axes, indexing='ij')
    valid = torch.ones(padded, dtype=torch.bool)
    flat = torch.zeros(padded, dtype=torch.long)
    for g, s in zip(grids, spatial):
        valid &= g < s
        flat = flat * s + g
    flat = window_partition(flat.masked_fill(~valid, 0)[None, ..., None], window).reshape(-1)
    valid = window_partition(valid[None, ..., None], window).reshape(-1)
    scatter = torch.empty(int(valid.sum()), dtype=torch.long)
    scatter[flat[valid]] = torch.nonzero(valid).squeeze(1)
    pad = torch.nonzero(~valid).squeeze(1)
    return (flat.to(device), None if pad.numel() == 0 else pad.to(device), scatter.to(device))


def _product(lists):
    """itertools.product over a short list of lists (kept local to stay compile-friendly)."""
    out = [()]
    for options in lists:
        out = [prefix + (o, ) for prefix in out for o in options]
    return out


def effective_window(spatial: Size, window: Size, shift: Size) -> Tuple[Size, Size]:
    """Clamp the window to the input and drop the shift along dims the window covers fully.

    Used by the video Swin (as mmaction2 does); the 2-D Swin keeps mmdet's behaviour of padding
    small inputs up to a full window instead.
    """
    win = tuple(min(s, w) for s, w in zip(spatial, window))
    sh = tuple(0 if s <= w else h for s, w, h in zip(spatial, window, shift))
    return win, sh

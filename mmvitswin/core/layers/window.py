"""Window helpers shared by the 2-D and 3-D Swin and the windowed ViT blocks.

Every function works on channels-last tensors ``(B, *spatial, C)`` with any number of spatial
dimensions (2 for images, 3 for video), so the image and video backbones share one code path.
"""
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F

from ..compat import statically_known_true
from ..validate import int_tuple
from .switch import is_tracing

Size = Tuple[int, ...]


def to_tuple(value, ndim: int, name: str) -> Size:
    """Expand an int to ``ndim`` ints, or validate a sequence of ``ndim`` positive ints
    (TypeError / ValueError naming ``name``: :func:`mmvitswin.core.validate.int_tuple`)."""
    return int_tuple(name, value, ndim, low=1)


def same_size(a, b) -> bool:
    """Whether sizes ``a`` and ``b`` are equal, decided without constraining a traced size:
    eager ints compare by value; while tracing, two symbolic sizes count as equal only where
    their expressions provably are (``statically_known_true``: no guard is added, so a size
    never gets specialised by the comparison).

    Why: the shortcuts below (a window clamped to its input is that input's size) keep
    ``(2s - 1) // s`` out of the traced shapes, and under Dynamo the same size read twice
    comes as two different objects, so a test of identity alone missed it: the test zoo's
    video Swin then traced for 219-226 s (``torch.compile(dynamic=True)``, two sizes, most of
    it sympy simplifying nested floor divisions), 29-34 s with this comparison (2-core AMD
    EPYC Zen 4, torch 2.13).
    """
    if a is b:
        return True
    if (type(a) is int and type(b) is int) or not is_tracing():  # (ints: eager, or constants)
        return a == b
    return statically_known_true(a == b)


def ceil_div(size, divisor: int):
    """``ceil(size / divisor)`` for sizes >= 0, with floor division of non-negative numbers
    only: ONNX's integer division truncates, so the usual ``-(-a // b)`` exports wrongly.

    A ``divisor`` that is ``size`` (a window clamped to its input, :func:`effective_window`;
    compared by :func:`same_size`) gives 1 without arithmetic: on a traced size (2s - 1) // s
    does not simplify to 1, and every shape derived from it would carry that expression into
    compile's and export's shape checks (minutes of tracing for a video Swin)."""
    if same_size(divisor, size):
        return 1
    return (size + divisor - 1) // divisor


def padded_size(size, window):
    """``size`` rounded up to a multiple of ``window`` (``size`` itself where the window is the
    size: see :func:`ceil_div`)."""
    return size if same_size(window, size) else ceil_div(size, window) * window


def cells_of(padded, window):
    """Windows along a dim of ``padded`` size (a multiple of ``window``): 1 where the window is
    the size itself (see :func:`ceil_div`)."""
    return 1 if same_size(window, padded) else padded // window


def pad_amount(size, multiple: int):
    """Zero padding that brings ``size`` up to a multiple of ``multiple``.

    No ``%`` on the size: on a traced (symbolic) size it ends up inside the float expressions
    of later resizes, which torch's scalar passes cannot handle.
    """
    return padded_size(size, multiple) - size


def pad_to_multiple(x: torch.Tensor, multiple: Size) -> Tuple[torch.Tensor, Size]:
    """Zero-pad the spatial dims of ``x: (B, *spatial, C)`` at their end up to ``multiple``.

    Returns the padded tensor and its padded spatial size. The pad is always applied while
    tracing (a zero-width pad is a no-op), so no branch depends on the input size.
    """
    spatial = x.shape[1:-1]
    pads = [pad_amount(s, m) for s, m in zip(spatial, multiple)]
    if is_tracing() or any(p != 0 for p in pads):
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
        shape += [cells_of(s, w), w]
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
    grid = [cells_of(s, w) for s, w in zip(spatial, window)]
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


def _grid_view(t: torch.Tensor, axis: int, ndim: int) -> torch.Tensor:
    """View a 1-D ``t`` so that it runs along ``axis`` of an ``ndim``-D broadcast grid."""
    shape = [1] * ndim
    shape[axis] = -1
    return t.view(shape)


def _rolled_arange(p, h: int, device) -> torch.Tensor:
    """``(arange(p) + h) mod p``: the padded position held by each position after a roll by
    ``-h`` (two slices, no ``%`` on a traced size: ONNX has no remainder by a symbolic size)."""
    pos = torch.arange(p, device=device)
    return torch.cat([pos[h:], pos[:h]]) if h else pos


def shift_window_mask(padded: Size, window: Size, shift: Size, device: torch.device,
                      fill: float = -100.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive attention mask for shifted windows: ``(num_windows, N, N)`` in ``dtype``.

    After a cyclic shift by ``-shift`` some windows hold tokens from different image regions;
    pairs from different regions get ``fill`` (the references use -100, not -inf, and we keep
    it to reproduce their numbers). Padded tokens are not masked, matching mmdet/mmseg/mmaction2.

    Computed from the sizes with tensor ops only (no Python loop over positions, no cache), so
    it traces with symbolic sizes: along each dim of padded length ``P`` the rolled positions
    fall in three regions, ``[0, P-w)``, ``[P-w, P-s)`` and ``[P-s, P)`` (the references'
    slices), labelled 0, 1, 2 and combined over the dims.
    """
    nd = len(padded)
    label = torch.zeros((), dtype=torch.long, device=device)
    for axis, (p, w, s) in enumerate(zip(padded, window, shift)):
        if s > 0:
            region = torch.cat([torch.zeros(p - w, dtype=torch.long, device=device),
                                torch.ones(w - s, dtype=torch.long, device=device),
                                torch.full((s, ), 2, dtype=torch.long, device=device)])
        else:
            region = torch.zeros(p, dtype=torch.long, device=device)
        label = label * 3 + _grid_view(region, axis, nd)
    labels = window_partition(label.expand(*padded)[None, ..., None], window).squeeze(-1)
    same = labels[:, None, :] == labels[:, :, None]  # (nW, N, N)
    # one pass: 0 where the pair shares a region, ``fill`` elsewhere
    return torch.where(same, torch.zeros((), dtype=dtype, device=device),
                       torch.full((), fill, dtype=dtype, device=device))


def window_gather_index(spatial: Size, window: Size, shift: Size, device: torch.device):
    """Indices that take a flattened input straight to padded, shifted windows and back.

    Equivalent to ``pad_to_multiple -> roll(-shift) -> window_partition`` (and the inverse with
    the crop), but as one gather each way instead of a chain of copies. For ``x: (B, L, C)``
    with ``L = prod(spatial)``:

    - ``gather`` ``(nW * N,)``: ``x[:, gather]`` lists the tokens window by window; entries that
      fall into padding point at token 0;
    - ``valid`` ``(nW * N,)`` bool: False where the entry is padding (to be zeroed);
    - ``scatter`` ``(L,)``: ``windows[:, scatter]`` puts every real token back in place.

    Built from ``arange``s, slices and integer arithmetic by the (constant) window size (no
    ``nonzero``, no cache, no remainder by a traced size), so the indices trace with symbolic
    sizes for compile and export: along each dim the rolled padded positions, viewed as
    ``(P / w, w)``, are exactly (window-grid cell, offset in window).
    """
    nd = len(spatial)
    cells = [ceil_div(s, w) for s, w in zip(spatial, window)]
    padded = [padded_size(s, w) for s, w in zip(spatial, window)]
    # Forward: a grid (G_0, .., G_{nd-1}, w_0, .., w_{nd-1}) in window order.
    flat = torch.zeros((), dtype=torch.long, device=device)
    valid = torch.ones((), dtype=torch.bool, device=device)
    for axis, (s, w, h, p, g) in enumerate(zip(spatial, window, shift, padded, cells)):
        real = F.pad(torch.ones(s, dtype=torch.bool, device=device), (0, p - s))
        order = _rolled_arange(p, h, device)
        coord = order.view(g, w)  # (cell, offset) -> padded position
        is_real = real[order].view(g, w)
        view = [1] * (2 * nd)
        view[axis], view[nd + axis] = g, w
        valid = valid & is_real.view(view)
        flat = flat * s + coord.view(view)
    gather = flat.masked_fill(~valid, 0).reshape(-1)
    # Inverse: for each real token (raster order), its position in window order.
    n = 1
    for w in window:
        n *= w
    cell_index = torch.zeros((), dtype=torch.long, device=device)
    offset_index = torch.zeros((), dtype=torch.long, device=device)
    for axis, (s, w, h, p, g) in enumerate(zip(spatial, window, shift, padded, cells)):
        # where real position y < s went in the rolled order: (y - h) mod p, written so that
        # the length stays the plain ``s`` (a slice ``[:s]`` of a length-``p`` tensor has the
        # symbolic length min(s, p), which makes every later shape check under compile slow)
        pos = torch.arange(s, device=device)
        rolled = pos - h + (pos < h).long() * p if h else pos
        rolled = _grid_view(rolled, axis, nd)
        cell_index = cell_index * g + rolled // w
        # (no ``%``: a window clamped to a traced input is itself symbolic, and ONNX has no
        # remainder by a symbolic divisor; positions are >= 0, so this is the same)
        offset_index = offset_index * w + (rolled - rolled // w * w)
    scatter = (cell_index * n + offset_index).reshape(-1)
    return gather, valid.reshape(-1), scatter


def window_gather_index_eager(spatial: Size, window: Size, shift: Size, device: torch.device):
    """:func:`window_gather_index`'s three indices, built by running the chain itself on the
    token numbers: ``arange`` over the input, padded with -1, rolled, partitioned; ``scatter``
    by one ``scatter_`` of the window positions. About 10 ops against the arithmetic's 50 per
    call for 2-D (a GPU pays each as a kernel launch); for eager calls only, as ``roll`` and the
    padding by a size-dependent amount do not trace with symbolic sizes as the arithmetic
    does."""
    nd = len(spatial)
    total = 1
    for s in spatial:
        total *= s
    numbers = torch.arange(total, device=device).view(*spatial)
    pad = []
    for s, w in zip(reversed(spatial), reversed(window)):
        pad += [0, padded_size(s, w) - s]
    if any(pad):
        numbers = F.pad(numbers, pad, value=-1)
    if any(shift):
        numbers = numbers.roll([-h for h in shift], dims=tuple(range(nd)))
    flat = window_partition(numbers[None, ..., None], window).reshape(-1)
    valid = flat >= 0
    # padding entries (-1) all land in slot 0, which is dropped; each token lands once
    scatter = torch.empty(total + 1, dtype=torch.long, device=device).scatter_(
        0, flat + 1, torch.arange(flat.numel(), device=device))[1:]
    return flat.clamp_min(0), valid, scatter


def real_query_spans(spatial: Size, window: Size, shift: Size):
    """Which queries of a 2-D (shifted) window partition hold real tokens, for attention that
    skips the queries of padding (their outputs are dropped by the merge).

    Per spatial dim, groups ``(first, stop, lo, hi)``: the window cells ``first..stop-1``
    along that dim whose real tokens all lie at local positions ``[lo, hi)`` (the hull: a pad
    that the shift puts inside a window keeps its middle). Windows are ordered row-major over
    the window grid and tokens row-major inside a window (:func:`window_gather_index`), so a
    group of window rows and a group of window columns give a block of windows and a block of
    their tokens. Returns ``(row_groups, col_groups)``, or None where no query can be skipped
    (or for another number of dims). Plain Python on the sizes: eager mode only.
    """
    if len(spatial) != 2:
        return None
    axes = []
    for size, w, s in zip(spatial, window, shift):
        padded = ceil_div(size, w) * w
        groups = []
        for g in range(padded // w):
            real = [r for r in range(w) if (g * w + r + s) % padded < size]
            span = [real[0], real[-1] + 1]
            if groups and groups[-1][2:] == span:
                groups[-1][1] = g + 1
            else:
                groups.append([g, g + 1, *span])
        axes.append(tuple(tuple(group) for group in groups))
    if all(len(a) == 1 and a[0][2:] == (0, w) for a, w in zip(axes, window)):
        return None
    return tuple(axes)


def effective_window(spatial: Size, window: Size, shift: Size) -> Tuple[Size, Size]:
    """Clamp the window to the input and drop the shift along dims the window covers fully.

    Used by the video Swin (as mmaction2 does); the 2-D Swin keeps mmdet's behaviour of padding
    small inputs up to a full window instead.
    """
    win, sh = [], []
    for s, w, h in zip(spatial, window, shift):
        # one comparison per dim, not ``min(s, w)``: on a traced size ``min`` would turn the
        # window into a symbolic min(s, w) that every later shape check has to reason about
        # (minutes of compile time); ``s <= w`` is a guard the shift needs anyway, and the
        # window is then either the constant ``w`` or the input's own size
        covered = s <= w
        win.append(s if covered else w)
        sh.append(0 if covered else h)
    return tuple(win), tuple(sh)

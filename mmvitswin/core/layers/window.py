"""Windows over channels-last maps ``(B, *spatial, C)``, for the 2-D and 3-D Swins and the
windowed ViT blocks.

A (shifted-)window partition is described by a :class:`WindowPlan`: one ``index_select``
takes the flattened tokens to padded, cyclically shifted windows (``gather``), another takes
the windows back (``scatter``), and ``mask`` is the additive shift mask. A stage builds its
plans once per forward (:func:`window_plan`) and passes them to its blocks. The same plan is
built the same way in eager runs and under ``torch.compile``/``torch.export``/ONNX: small
integer ops on the sizes (no ``nonzero``, no ``.item()``, no remainder by a traced size), so
every size traces alike and the model also runs on the ``meta`` device.
"""
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..compat import is_tracing, statically_known_true
from ..validate import int_tuple

Size = Tuple[int, ...]

#: Logit added to token pairs from different image regions in a shifted window: the
#: references' -100 (not -inf), kept to reproduce their numbers.
SHIFT_MASK_FILL = -100.0


def to_tuple(value, ndim: int, name: str) -> Size:
    """Expand an int to ``ndim`` ints, or validate a sequence of ``ndim`` positive ints
    (TypeError / ValueError naming ``name``: :func:`mmvitswin.core.validate.int_tuple`)."""
    return int_tuple(name, value, ndim, low=1)


def same_size(a, b) -> bool:
    """Whether sizes ``a`` and ``b`` are equal, without constraining a traced size: while
    tracing two symbolic sizes count as equal only where their expressions provably are (no
    guard is added). A window clamped to its input is that input's size, and saying so keeps
    expressions such as ``(2s - 1) // s`` out of the traced shapes, which otherwise make a
    dynamic-shape compile of the video Swin spend minutes simplifying them."""
    if a is b:
        return True
    if (type(a) is int and type(b) is int) or not is_tracing():
        return a == b
    return statically_known_true(a == b)


def ceil_div(size, divisor: int):
    """``ceil(size / divisor)`` for sizes >= 0 by floor division of non-negative numbers only
    (ONNX's integer division truncates, so ``-(-a // b)`` would export wrongly); 1 where the
    divisor is the size itself (:func:`same_size`)."""
    if same_size(divisor, size):
        return 1
    return (size + divisor - 1) // divisor


def padded_size(size, window):
    """``size`` rounded up to a multiple of ``window``."""
    return size if same_size(window, size) else ceil_div(size, window) * window


def cells_of(padded, window):
    """Windows along a dim of ``padded`` size (a multiple of ``window``)."""
    return 1 if same_size(window, padded) else padded // window


def pad_amount(size, multiple: int):
    """Zero padding that brings ``size`` up to a multiple of ``multiple`` (no ``%`` on the
    size: on a traced size it would end up inside later float expressions)."""
    return padded_size(size, multiple) - size


def crop_to(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Crop an NCHW map at the bottom/right to ``size`` (undoes corner padding).

    A negative pad, not a slice: it writes a new tensor, whose strides do not depend on whether
    anything was cropped. A slice's view would be contiguous in one of its layouts exactly when
    nothing was cropped, and the backward of a traced graph guards on that, so one size that
    needs no crop would recompile a graph traced at a size that did."""
    return F.pad(x, (0, size[1] - x.shape[-1], 0, size[0] - x.shape[-2]))


def end_pads(pads) -> list:
    """``F.pad``'s argument that pads the last ``len(pads)`` dims at their end by ``pads``
    (first dim first)."""
    flat = []
    for p in reversed(pads):
        flat += [0, p]
    return flat


def window_partition(x: torch.Tensor, window: Size) -> torch.Tensor:
    """Split ``x: (B, *spatial, C)`` into windows ``(B * num_windows, prod(window), C)``; each
    spatial dim a multiple of its window. Windows row-major over the window grid, batch
    outermost, as in every reference Swin."""
    b, c = x.shape[0], x.shape[-1]
    nd = len(window)
    shape = [b]
    for s, w in zip(x.shape[1:-1], window):
        shape += [cells_of(s, w), w]
    x = x.view(*shape, c).permute(0, *range(1, 2 * nd, 2), *range(2, 2 * nd + 1, 2), 2 * nd + 1)
    numel = 1
    for w in window:
        numel *= w
    return x.reshape(-1, numel, c)


def window_reverse(windows: torch.Tensor, window: Size, spatial: Size) -> torch.Tensor:
    """Inverse of :func:`window_partition`: ``(B * nW, prod(window), C) -> (B, *spatial, C)``."""
    c, nd = windows.shape[-1], len(window)
    grid = [cells_of(s, w) for s, w in zip(spatial, window)]
    x = windows.view(-1, *grid, *window, c)
    order = [0]
    for i in range(nd):
        order += [1 + i, 1 + nd + i]
    return x.permute(*order, 2 * nd + 1).reshape(x.shape[0], *spatial, c)


def relative_position_index(window: Size) -> torch.Tensor:
    """``(N, N)`` long, ``N = prod(window)``: for tokens ``a`` and ``b`` of a window, the
    row-major position of the offset ``a - b`` in a ``(2w_0 - 1, 2w_1 - 1, ...)`` table (the
    indexing of the Microsoft, mmdet and mmaction2 Swins)."""
    axes = [torch.arange(w) for w in window]
    coords = torch.stack(torch.meshgrid(*axes, indexing='ij')).flatten(1)  # (nd, N)
    rel = coords[:, :, None] - coords[:, None, :]
    index = torch.zeros(rel.shape[1:], dtype=torch.long)
    stride = 1
    for d in reversed(range(len(window))):
        index += (rel[d] + window[d] - 1) * stride
        stride *= 2 * window[d] - 1
    return index


def effective_window(spatial: Size, window: Size, shift: Size) -> Tuple[Size, Size]:
    """The window clamped to the input and no shift along dims the window covers fully (the
    video Swin, as mmaction2; the 2-D Swin pads small maps to a full window instead). One
    comparison per dim, not ``min(s, w)``: the window stays either the constant or the
    input's own size, never a symbolic ``min``."""
    win, sh = [], []
    for s, w, h in zip(spatial, window, shift):
        covered = s <= w
        win.append(s if covered else w)
        sh.append(0 if covered else h)
    return tuple(win), tuple(sh)


class WindowPlan(NamedTuple):
    """How a map of ``spatial`` size goes to windows and back (:func:`window_plan`).

    ``gather (nW * N,)``: ``x[:, gather]`` (``x: (B, L, C)``, ``L = prod(spatial)``) lists the
    tokens window by window; ``is_pad (nW * N,)`` bool: the entries that are padding
    (``gather`` points them at token 0); ``scatter (L,)``: ``windows[:, scatter]`` puts every
    token back; ``mask``: the ``(nW, N, N)`` fp32 shift mask, None without a shift;
    ``padded``: whether any entry is padding (always True while tracing); ``num_windows``:
    windows per image, the product of the window grid (the windows' batch dim is ``B *
    num_windows``, a product: a traced size derived by division instead, ``(B * L) // N``,
    is an expression the shape reasoning of ``torch.compile``/``torch.export`` cannot
    simplify, and carries it through every later shape)."""
    window: Size
    gather: torch.Tensor
    is_pad: torch.Tensor
    scatter: torch.Tensor
    mask: Optional[torch.Tensor]
    padded: bool
    num_windows: int


def shift_mask_table(window: Size, shift: Size) -> torch.Tensor:
    """The shift masks a window can have, ``(2**k, N, N)`` fp32 for ``k`` shifted dims.

    The references' mask: along a dim of padded length ``P`` the rolled positions fall in
    three regions, ``[0, P-w)``, ``[P-w, P-s)`` and ``[P-s, P)``, and token pairs from
    different regions get :data:`SHIFT_MASK_FILL` (padded tokens are not masked, as in
    mmdet/mmseg/mmaction2). Only the last window along a shifted dim holds two regions (its
    offsets below ``w - s`` and from there on; every other window lies inside ``[0, P-w)``),
    so a window's mask depends on which shifted dims it is last along, not on the map's size:
    entry ``t`` is the mask of a window that is last along the shifted dims whose bit is set
    in ``t``."""
    axes = [a for a, s in enumerate(shift) if s]
    offsets = torch.meshgrid(*[torch.arange(w) for w in window], indexing='ij')
    masks = []
    for kind in range(2**len(axes)):
        label = torch.zeros(window, dtype=torch.long)
        for bit, axis in enumerate(axes):
            if kind >> bit & 1:
                label = label * 2 + (offsets[axis] >= window[axis] - shift[axis]).long()
        label = label.flatten()
        masks.append(torch.where(label[None, :] == label[:, None], 0., SHIFT_MASK_FILL))
    return torch.stack(masks)


def _window_kinds(padded: Size, window: Size, shift: Size, device) -> torch.Tensor:
    """Each window's entry of :func:`shift_mask_table`, ``(nW,)`` long, windows row-major."""
    grid = [cells_of(p, w) for p, w in zip(padded, window)]
    kinds, bit = None, 0
    for axis, (cells, s) in enumerate(zip(grid, shift)):
        if not s:
            continue
        view = [1] * len(grid)
        view[axis] = -1
        last = (torch.arange(cells, device=device) == cells - 1).view(view)
        term = last.long() if bit == 0 else last * (1 << bit)
        kinds = term if kinds is None else kinds + term
        bit += 1
    return kinds.expand(*grid).reshape(-1)


def window_plan(spatial: Size, window: Size, shift: Size, device: torch.device,
                mask_table: Optional[torch.Tensor] = None) -> WindowPlan:
    """The :class:`WindowPlan` of ``pad to a multiple of window -> roll by -shift ->
    partition``: the chain run once on the token numbers (padding numbered -1), so both index
    tensors come from about ten small integer ops. The pad comes **before** the shift, as in
    mmdet/mmseg/mmaction2 and Microsoft's detection code. The roll is two slices joined (no
    remainder by a traced size). The shift mask is picked per window from ``mask_table``
    (:func:`shift_mask_table` of this window and shift, built here where not given)."""
    total = 1
    for s in spatial:
        total *= s
    numbers = torch.arange(total, device=device).view(*spatial)
    pads = [pad_amount(s, w) for s, w in zip(spatial, window)]
    padded = is_tracing() or any(p != 0 for p in pads)  # a traced size may need padding
    if padded:
        numbers = F.pad(numbers, end_pads(pads), value=-1)
    for axis, h in enumerate(shift):
        if h:
            size = numbers.shape[axis]
            numbers = torch.cat([numbers.narrow(axis, h, size - h), numbers.narrow(axis, 0, h)],
                                axis)
    full = tuple(numbers.shape)
    num_windows = 1
    for p, w in zip(full, window):
        num_windows *= cells_of(p, w)
    flat = window_partition(numbers[None, ..., None], window).reshape(-1)
    is_pad = flat < 0
    # padding entries all land in slot 0, which is dropped; every token lands once
    scatter = torch.zeros(total + 1, dtype=torch.long, device=device).scatter(
        0, flat + 1, torch.arange(flat.shape[0], device=device))[1:]
    mask = None
    if any(shift):
        if mask_table is None:
            mask_table = shift_mask_table(window, shift).to(device)
        mask = mask_table.index_select(0, _window_kinds(full, window, shift, device))
    return WindowPlan(tuple(window), flat.clamp_min(0), is_pad, scatter, mask, padded,
                      num_windows)


def blocks_window_plan(blocks, grid: Size, device: torch.device) -> Optional[WindowPlan]:
    """The unshifted square-window plan of ``grid`` for the windowed blocks among ``blocks``
    (a ``window_size`` > 0: ViTDet's; a trunk gives them all one size), built once per forward
    and passed to each of them; None where no block is windowed."""
    sizes = {getattr(block, 'window_size', 0) for block in blocks} - {0}
    if not sizes:
        return None
    if len(sizes) > 1:
        raise ValueError(f'the windowed blocks must share one window_size, got {sorted(sizes)}')
    size = sizes.pop()
    return window_plan(tuple(grid), (size, size), (0, 0), device)


def partition_windows(x: torch.Tensor, plan: WindowPlan) -> torch.Tensor:
    """``x: (B, *spatial, C)`` -> windows ``(B * nW, N, C)`` by ``plan``; padding entries
    are 0."""
    b, c = x.shape[0], x.shape[-1]
    windows = x.reshape(b, -1, c).index_select(1, plan.gather)
    if plan.padded:
        windows = windows.masked_fill(plan.is_pad[:, None], 0.)
    n = 1
    for w in plan.window:
        n *= w
    return windows.view(b * plan.num_windows, n, c)


def merge_windows(windows: torch.Tensor, plan: WindowPlan, shape) -> torch.Tensor:
    """Inverse of :func:`partition_windows`: ``(B * nW, N, C)`` -> ``shape`` ``(B, *spatial,
    C)`` (shift undone, padding cropped). ``windows`` may be a strided view."""
    return windows.reshape(shape[0], -1, shape[-1]).index_select(1, plan.scatter).view(shape)

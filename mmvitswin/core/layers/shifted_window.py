"""(Shifted-)window multi-head self-attention on channels-last N-D inputs.

Shared by the 2-D Swin (windows of ``(Wh, Ww)``) and the video Swin (``(Wt, Wh, Ww)``).
"""
import contextlib
import contextvars
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..compat import as_autocast_would
from .attention import WindowAttention
from .switch import eager_autograd, is_tracing
from .window import (effective_window, padded_size, real_query_spans, shift_window_mask,
                     window_gather_index, window_gather_index_eager)


_SHARED: 'contextvars.ContextVar[Optional[dict]]' = contextvars.ContextVar(
    'mmvitswin_shared_window_indices', default=None)


def shared_window_indices():
    """A context (a Swin stage's forward) in which the blocks that attend windows of the same
    sizes share their gather indices and shift mask: the first block builds them, the others
    reuse them, and they are dropped on exit, so nothing is kept between calls. A stage's
    blocks alternate between two (window, shift) pairs: Swin-T's 12 blocks build 8 sets instead
    of 12, Swin-B's 24 build 8 instead of 24; each set is 10-30 small integer ops, which a GPU
    pays as kernel launches. Nested scopes share the outermost one's. While tracing, a null
    context: every block builds its own (the graph then holds the ops once per block)."""
    if is_tracing():
        return contextlib.nullcontext()
    return _sharing_scope()


@contextlib.contextmanager
def _sharing_scope():
    if _SHARED.get() is not None:
        yield
        return
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def shared(key: tuple, build: Callable):
    """``build()``, or what it gave for ``key`` earlier in the current
    :func:`shared_window_indices` scope. Tensors shared this way are never written in place."""
    if is_tracing():  # (and Dynamo cannot read a ContextVar)
        return build()
    memo = _SHARED.get()
    if memo is None:
        return build()
    if key not in memo:
        memo[key] = build()
    return memo[key]


class WindowIndex(NamedTuple):
    """The indices of one window partition (:func:`~.window.window_gather_index`): ``gather``
    and ``valid`` take tokens to windows, ``scatter`` takes them back; ``padded``: whether any
    window entry is padding (``valid`` not all True); ``padding``: the padding entries'
    positions (eager CPU calls with padding; None elsewhere), which the fill, the zeroing and
    the padding's gradient sum then read and write alone, where a mask over every entry is
    read otherwise."""
    gather: torch.Tensor
    valid: torch.Tensor
    scatter: torch.Tensor
    padded: bool
    padding: Optional[torch.Tensor] = None


def _to_windows(x: torch.Tensor, index: WindowIndex, fill: Optional[torch.Tensor]):
    """``x: (B, L, C)`` -> ``(B, nW * N, C)``: the gather, padding entries 0 or ``fill`` (in
    ``x``'s dtype)."""
    windows = x.index_select(1, index.gather)
    if not index.padded:
        return windows
    # in place where it can: index_select's output is new, and nothing keeps it for a backward
    if index.padding is not None:  # the padding rows alone
        if fill is None:
            return windows.index_fill_(1, index.padding, 0.)
        return windows.index_copy_(1, index.padding, fill.expand(
            windows.shape[0], index.padding.shape[0], -1))
    if fill is None:
        return windows.masked_fill_(~index.valid[:, None], 0.)
    return torch.where(index.valid[:, None], windows, fill)


class _Partition(torch.autograd.Function):
    """:func:`_to_windows` whose backward is the inverse gather (:class:`_Merge`), not
    ``index_select``'s generic backward.

    Why: ``index_select`` cannot know its index is a permutation, so its backward adds the
    gradient into a zeroed tensor (``index_add``), a zero fill and a scatter of every value.
    Every real token appears exactly once among the windows' valid entries, so its gradient
    is the gradient at that one entry: a plain gather by ``scatter`` (and the padding rows'
    gradient summed for ``fill``). Same values as autograd's form."""

    @staticmethod
    def forward(ctx, x, index, fill):
        ctx.index = index
        return _to_windows(x, index, fill)

    @staticmethod
    def backward(ctx, grad):
        index = ctx.index
        grad_x = _Merge.apply(grad, index) if ctx.needs_input_grad[0] else None
        grad_fill = None
        if ctx.needs_input_grad[2] and index.padded:
            grad_fill = _padding_sum(grad, index)
        return grad_x, None, grad_fill


def _padding_sum(grad: torch.Tensor, index: WindowIndex) -> torch.Tensor:
    """The sum of ``grad (B, nW * N, C)`` over the padding entries -> ``(C,)``: their rows
    only where ``index.padding`` lists them, else a masked sum over all rows."""
    if index.padding is not None:
        return grad.index_select(1, index.padding).sum((0, 1))
    return (grad * ~index.valid[:, None]).sum((0, 1))


class _Merge(torch.autograd.Function):
    """``windows (B, nW * N, C)`` -> ``(B, L, C)`` by ``scatter``; the backward is the
    partition of the gradient (padding entries 0): :class:`_Partition`, as its inverse."""

    @staticmethod
    def forward(ctx, windows, index):
        ctx.index = index
        return windows.index_select(1, index.scatter)

    @staticmethod
    def backward(ctx, grad):
        return _Partition.apply(grad, ctx.index, None), None


def _window_index(spatial, window, shift, device) -> WindowIndex:
    """The partition's indices: in eager calls from :func:`~.window.window_gather_index_eager`
    (the same indices from a fifth of the ops); while tracing from the arithmetic, with the
    padding always filled (the sizes may be symbolic: no comparison)."""
    if is_tracing():
        return WindowIndex(*window_gather_index(spatial, window, shift, device), True)
    padded = any(padded_size(s, w) != s for s, w in zip(spatial, window))
    gather, valid, scatter = window_gather_index_eager(spatial, window, shift, device)
    # (found once per stage; on a GPU the nonzero would wait for the device)
    padding = (~valid).nonzero().flatten() if padded and device.type == 'cpu' else None
    return WindowIndex(gather, valid, scatter, padded, padding)


def partition_windows(x: torch.Tensor, window: Tuple[int, ...], shift: Tuple[int, ...],
                      fill: Optional[torch.Tensor] = None):
    """``x: (B, *spatial, C)`` -> ``(windows (B * nW, N, C), index, padded)``.

    Pads each spatial dim at its end to a multiple of the window (with zeros, or with the
    ``(C,)`` vector ``fill``), rolls by ``-shift`` and splits into windows, as one gather
    (``window_gather_index``); ``index`` (:class:`WindowIndex`) and :func:`merge_windows`
    undo it. ``padded`` is the padded spatial size. With autograd (eager) each direction's
    backward is the other direction's gather (:class:`_Partition`).
    """
    spatial = tuple(x.shape[1:-1])
    b, c = x.shape[0], x.shape[-1]
    n = 1
    for w in window:
        n *= w
    index = shared(('index', spatial, window, shift, x.device),
                   lambda: _window_index(spatial, window, shift, x.device))
    flat = x.reshape(b, -1, c)
    if fill is not None:
        fill = fill.to(flat.dtype)
    if eager_autograd(flat, fill):
        windows = _Partition.apply(flat, index, fill)
    else:
        windows = _to_windows(flat, index, fill)
    padded = tuple(padded_size(s, w) for s, w in zip(spatial, window))
    return windows.view(-1, n, c), index, padded


def merge_windows(windows: torch.Tensor, index: WindowIndex, shape) -> torch.Tensor:
    """Inverse of :func:`partition_windows`: ``(B * nW, N, C)`` back to ``shape`` ``(B, *spatial,
    C)`` (roll back, crop the padding); ``index``: what the partition returned. ``windows`` may
    be a strided view (CUDA's attention kernels return their heads interleaved in memory):
    then the flattening copies."""
    flat = windows.reshape(shape[0], -1, shape[-1])
    if eager_autograd(flat):
        return _Merge.apply(flat, index).view(shape)
    return flat.index_select(1, index.scatter).view(shape)


def shifted_window_attention(x: torch.Tensor, attn: WindowAttention, window: Tuple[int, ...],
                             shift: Tuple[int, ...], clamp_to_input: bool = False) -> torch.Tensor:
    """(S)W-MSA of ``x: (B, *spatial, C)`` with the window attention module ``attn``.

    Semantics: pad each spatial dim to a multiple of the window (end of the dim), roll by
    ``-shift``, attend inside windows with the relative position bias and the shift mask,
    roll back, crop the padding. The pad comes **before** the shift, as in mmdet/mmseg/mmaction2.
    The pad/roll/partition chain runs as one gather each way (:func:`partition_windows`); the
    indices and the mask are recomputed from the sizes on every forward (a few small integer
    ops; the blocks of a stage share them: :func:`shared_window_indices`), so nothing is kept
    between calls and every size traces the same way.

    Eager mode projects the real tokens only: q/k/v before the partition (a zero padding
    token projects to the projection's bias, which is what the padding of the projected
    windows holds: ``attn.project_with_zero``), the output after the merge (padding outputs are
    dropped anyway); on a CPU the attention may also skip the padding's queries
    (``real_queries``: :func:`~.window.real_query_spans`, :func:`skips_padding_queries`).
    Same function as projecting the padded windows, without the padding's rows in the
    products: up to 2x fewer rows on small maps, which are padded to whole windows. With
    autograd it costs the gather's backward on 3C channels instead of C (then an
    ``index_add``; since 2026-12-04 the inverse gather, :class:`_Partition`), and still
    measured faster (train step, sizes x0.4, 2-core AMD EPYC Zen 5: SwinV2-T fp32
    9-11 %, bf16 -2 to +6 %; Swin-T fp32 1-6 %, bf16 -2 to +3.5 %; the video Swin-T fp32 5 %,
    bf16 no change; Zen 4: SwinV2-T fp32 3-17 %, bf16 11-13 %, Swin-T fp32 15 %, bf16
    2-3.5 %).
    Traced calls (compile, export) project the padded windows: the same graph as before,
    whose dynamic-shape compile of the video Swin took 133 s against 198 s for the other
    order (measured before :func:`~.window.same_size`, which took it to about 30 s).

    ``clamp_to_input``: shrink the window (and drop the shift) along dims where the input is not
    larger than the window, as the video Swin does; the 2-D Swin keeps mmdet's full windows.
    A free function so that backbones whose checkpoints name the attention differently
    (mmdet ``attn.w_msa``, mmaction2 ``attn``) share it.
    """
    if clamp_to_input:
        window, shift = effective_window(tuple(x.shape[1:-1]), window, shift)
    if is_tracing():
        # the projection casts its input to autocast's dtype anyway: cast before the window
        # gather, which then moves half the bytes (same values either way)
        x = as_autocast_would(x)
        windows, index, padded = partition_windows(x, window, shift)
        mask = _mask(padded, window, shift, x)
        return merge_windows(attn(windows, mask), index, x.shape)
    qkv, zero = attn.project_with_zero(x)
    windows, index, padded = partition_windows(qkv, window, shift, zero)
    real = real_query_spans(tuple(x.shape[1:-1]), window, shift) \
        if skips_padding_queries(x) else None
    out = attn.attend_windows(windows, _mask(padded, window, shift, qkv), real_queries=real)
    return attn.output(merge_windows(out, index, x.shape))  # heads merged: C channels


def skips_padding_queries(x: torch.Tensor) -> bool:
    """Whether the eager window attention on ``x`` is offered the real queries' spans
    (windows that use them: V2's cosine attention, in inference and, where enough queries
    are padding, with autograd: :class:`~.cosine_window._RealQueryAttention`). On the CPU,
    where it was measured to pay; not on other devices: the blocks add dispatched ops (a
    SwinV2-T forward: 2948 instead of 1877 at 288x448, 3802 instead of 1880 at 800x1216),
    and a GPU at detection batch sizes waits on the host issuing kernels, not on the rows
    (an H200 at batch 1 was busy 3.5 of 87 ms)."""
    return x.device.type == 'cpu'


def _mask(padded, window, shift, like: torch.Tensor) -> Optional[torch.Tensor]:
    """The shift mask (None without a shift) in ``like``'s dtype (0 and -100 are exact in every
    float dtype) and device."""
    if not any(shift):
        return None
    return shared(('mask', padded, window, shift, like.device, like.dtype),
                  lambda: shift_window_mask(padded, window, shift, like.device, dtype=like.dtype))


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

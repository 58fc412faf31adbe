"""``Linear``: ``nn.Linear`` whose fp32 CPU product may take the fast path (``layers.switch``).

Why: on some CPUs (measured on AMD EPYC, torch 2.13) PyTorch's ``F.linear`` (MKL's sgemm) runs
the thin matrices of a vision transformer (K or N of 96-1536) at about half the speed of
oneDNN. A 1x1 ``F.conv2d`` on a channels-last view is the same product, and PyTorch hands it
to oneDNN when it runs on more than one thread; ``torch.nn.grad.conv2d_weight`` is the matching
weight gradient. oneDNN builds and keeps a kernel ("primitive") for every input shape it sees,
so feeding it each new image size would grow memory without bound (measured: 1 GiB over 600
shapes). The fast path therefore cuts the rows into chunks whose sizes come from the fixed
ladder ``CHUNK_ROWS`` (largest first): at most ``len(CHUNK_ROWS)`` primitives per (in, out)
feature pair and direction, a fixed number per model whatever the input sizes. Chunks with
less work than ``MIN_CHUNK_MACS`` are not made (oneDNN's per-call cost would eat the gain); the
rows left over go through ``F.linear``/``mm``. In inference the FFN runs both its layers chunk
by chunk (:func:`mlp_inference`), so its hidden activation never exists whole.

Forward and backward are one autograd function (:class:`_ChunkedLinear`): the input gradient is
the same chunking through 1x1 transposed convolutions, the weight gradient a sum of per-chunk
oneDNN weight gradients. (Letting autograd differentiate the chunks one by one would give every
row slice a full-size zero gradient to add up: quadratic in the row count.)

Taken only where :func:`~.switch.fast_path_active` allows (CPU, no autocast, not traced), for
fp32, with more than one thread, and when there is at least one full chunk. Same numbers as
``F.linear`` up to float rounding.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.grad import conv2d_weight

from ..compat import custom_bwd, custom_fwd, get_autocast_dtype, is_autocast_enabled
from .switch import fast_path_active, is_tracing

#: Chunk sizes in rows, largest first. Large chunks amortise the per-call cost; the halving
#: steps cover any remainder with at most one call per size.
CHUNK_ROWS = (4096, 2048, 1024, 512, 256, 128, 64)
#: Least work (multiply-adds) of one chunk: below it ``F.linear`` is as fast or faster (narrow
#: layers on few rows), so smaller chunks are not made and those rows go to ``F.linear``.
MIN_CHUNK_MACS = 16 << 20


def _chunks(rows: int, in_features: int,
            out_features: int) -> Tuple[List[Tuple[int, int]], int]:
    """``([(start, size), ...], covered)``: consecutive chunks from the ladder, greedily, none
    with less work than ``MIN_CHUNK_MACS``; rows ``covered:`` are left over."""
    spans, start = [], 0
    for size in CHUNK_ROWS:
        if size * in_features * out_features < MIN_CHUNK_MACS:
            break
        while rows - start >= size:
            spans.append((start, size))
            start += size
    return spans, start


def _conv_rows(flat: torch.Tensor, spans, covered: int, weight: torch.Tensor,
               bias: Optional[torch.Tensor], then=None, transposed: bool = False) -> torch.Tensor:
    """``flat @ weight.T + bias`` for a 2-D ``flat`` (``flat @ weight`` with ``transposed``,
    the input gradient of a linear layer): chunks as 1x1 convolutions (transposed: 1x1
    transposed convolutions, no copy of the weight), the rest as ``F.linear``/``mm``.
    ``then = (activation, weight2, bias2)`` applies a second linear layer after the activation
    chunk by chunk (an MLP whose hidden rows never exist all at once)."""
    rows, k = flat.shape
    conv = F.conv_transpose2d if transposed else F.conv2d
    layers = [(conv, weight, bias)]
    if then is not None:
        layers.append((F.conv2d, *then[1:]))

    def product(start, size):
        # a channels-last input gives a channels-last output, the next layer's input
        h = flat[start:start + size].view(1, size, 1, k).permute(0, 3, 1, 2)
        for i, (op, w, b) in enumerate(layers):
            h = op(then[0](h) if i else h, w[:, :, None, None], b)
        return h.permute(0, 2, 3, 1).reshape(size, -1)  # rows again, without a copy

    if covered == rows and len(spans) == 1:
        return product(0, rows)
    n_out = layers[-1][1].shape[1 if transposed and then is None else 0]
    out = flat.new_empty(rows, n_out)
    for start, size in spans:
        out[start:start + size] = product(start, size)
    if covered < rows:
        rest = flat[covered:] @ weight if transposed else F.linear(flat[covered:], weight, bias)
        out[covered:] = rest if then is None else F.linear(then[0](rest), *then[1:])
    return out


class _ChunkedLinear(torch.autograd.Function):
    """``F.linear`` on a 2-D input through :func:`_conv_rows`, forward and backward."""

    @staticmethod
    @custom_fwd('cpu')
    def forward(ctx, flat, weight, bias, spans, covered):
        ctx.save_for_backward(flat, weight)
        ctx.has_bias = bias is not None
        return _conv_rows(flat, spans, covered, weight, bias)

    @staticmethod
    @custom_bwd('cpu')
    def backward(ctx, grad_out):
        flat, weight = ctx.saved_tensors
        grads = linear_grads(grad_out, flat, weight, ctx.needs_input_grad[0],
                             ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        return (*grads, None, None)


def linear_grads(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 input_grad: bool = True, weight_grad: bool = True, bias_grad: bool = True):
    """Gradients of ``F.linear(x, weight, bias)`` for ``grad_out``: ``(grad_x, grad_weight,
    grad_bias)`` (``None`` where not asked), through oneDNN chunks where the fast path allows."""
    n, k = weight.shape
    g = grad_out.reshape(-1, n)
    flat = x.reshape(-1, k)
    _, spans, covered = _plan(g, weight, flat)
    if spans:
        g = g.contiguous()
        flat = flat.contiguous()
    grad_x = grad_w = grad_b = None
    if input_grad:
        grad_x = (_conv_rows(g, spans, covered, weight, None, transposed=True) if spans
                  else g @ weight).view(x.shape)
    if weight_grad:
        if spans:
            kernel_shape = (n, k, 1, 1)
            for start, size in spans:
                part = conv2d_weight(
                    flat[start:start + size].view(1, size, 1, k).permute(0, 3, 1, 2),
                    kernel_shape, g[start:start + size].view(1, size, 1, n).permute(0, 3, 1, 2))
                grad_w = part if grad_w is None else grad_w.add_(part)
            grad_w = grad_w.view(n, k)
            if covered < g.shape[0]:
                grad_w.addmm_(g[covered:].t(), flat[covered:])
        else:
            grad_w = g.t() @ flat
    if bias_grad:
        grad_b = g.sum(0)
    return grad_x, grad_w, grad_b


def _plan(x: torch.Tensor, weight: torch.Tensor, *others: torch.Tensor):
    """``(rows, spans, covered)`` of the chunked path for the rows of ``x`` times ``weight``
    (``_chunks``; ``others`` must qualify too), or ``(0, [], 0)`` where it does not apply: the
    switch is off, fewer than two threads, not all fp32, or not one chunk's worth of work."""
    # the switch first: while tracing, the row count below is symbolic and must not be compared
    if not fast_path_active(x, weight, *others):
        return 0, [], 0
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if (rows < CHUNK_ROWS[-1] or torch.get_num_threads() < 2
            or any(t.dtype != torch.float32 for t in (x, weight, *others))):
        return 0, [], 0
    spans, covered = _chunks(rows, *weight.shape)
    return (rows, spans, covered) if spans else (0, [], 0)


def _cast_for_autocast(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """``(x, weight, bias)`` cast to autocast's dtype as autocast would cast them for
    ``F.linear`` (floating tensors other than fp64), in eager inference (no autograd, not
    traced) under autocast; elsewhere unchanged.

    Why: autocast keeps its cast of every weight (a leaf that requires grad) until the
    autocast region ends, so a forward holds a low-precision copy of all its weights at once,
    fresh memory from the OS on every call, freed at the region's exit. Cast here, each copy is
    freed after its product and its memory serves the next layer's. Same values; the SwinV2-T
    bf16 forward ran 4 % faster on new input sizes and 10 % on sizes seen before (separate
    processes, medians of six; 2-core AMD EPYC Zen 5)."""
    device = x.device.type
    if torch.is_grad_enabled() or not is_autocast_enabled(device) or is_tracing():
        return x, weight, bias
    dtype = get_autocast_dtype(device)

    def cast(t):
        return t if t is None or not t.is_floating_point() or t.dtype == torch.float64 \
            else t.to(dtype)

    return cast(x), cast(weight), cast(bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through fixed-size oneDNN chunks where the switch allows
    (autocast's casts made per layer in inference: :func:`_cast_for_autocast`)."""
    rows, spans, covered = _plan(x, weight)
    if not rows:
        return F.linear(*_cast_for_autocast(x, weight, bias))
    out = _ChunkedLinear.apply(x.reshape(rows, x.shape[-1]).contiguous(), weight, bias, spans,
                               covered)
    return out.view(*x.shape[:-1], weight.shape[0])


def mlp_inference(x: torch.Tensor, fc1: nn.Linear, act: nn.Module, fc2: nn.Linear):
    """``fc2(act(fc1(x)))`` without autograd through fixed-size oneDNN chunks, each chunk's
    hidden rows consumed at once (never the whole hidden tensor in memory); ``None`` where the
    fast path does not apply (then run the layers as usual)."""
    if torch.is_grad_enabled() and any(p.requires_grad for p in (x, fc1.weight, fc2.weight)):
        return None
    rows, spans, covered = _plan(x, fc1.weight, fc2.weight)
    if not rows:
        return None
    flat = x.reshape(rows, x.shape[-1]).contiguous()
    out = _conv_rows(flat, spans, covered, fc1.weight, fc1.bias, then=(act, fc2.weight, fc2.bias))
    return out.view(*x.shape[:-1], fc2.weight.shape[0])


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict keys) that calls :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

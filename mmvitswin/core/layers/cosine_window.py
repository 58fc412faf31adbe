"""Swin V2 window attention: scaled cosine attention with a log-spaced continuous position bias.

- :func:`log_spaced_relative_coords`: the ``(prod(2w - 1), 2)`` table of relative offsets the
  position-bias MLP reads, ``sign(d) * log2(1 + 8 |d| / (p - 1)) / 3`` per axis, where ``p`` is
  the *pretrained* window (the window the MLP was trained at) or, without one, the window.
  Keeping ``p`` fixed while the window grows is how a window-8 checkpoint runs at window 16/24:
  the offsets it saw map to the same inputs, larger offsets extrapolate smoothly, and no table
  is resampled.
- :func:`continuous_position_bias`: ``16 * sigmoid(mlp(coords))`` gathered to ``(heads, N, N)``,
  always computed in fp32 (outside autocast): it is small, bounded, and fp16 would round it
  (bf16 inference casts the result, as SDPA reads its bias in q's dtype). Eager CPU inference
  keeps each block's ``(heads, rows)`` table while the weights it came from keep their values
  (:meth:`CosineWindowAttention._kept`).
- :class:`CosineWindowAttention`: ``softmax(cos(q, k) * exp(min(logit_scale, log 100)) + bias +
  mask) v`` inside windows. The qkv projection has no bias of its own but ``q_bias`` and
  ``v_bias`` (no key bias), as every released Swin V2. q and k are normalised in fp32, so
  zero-padded tokens (k = 0) stay finite in fp16.
- :class:`ShiftWindowMSAV2`: the (shifted-)window wrapper (``w_msa``, mmpretrain's key names)
  over :func:`~.shifted_window.shifted_window_attention` (padding before the cyclic shift, the
  -100 shift mask), shared with the V1 Swin.
"""
import math
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..compat import is_autocast_enabled
from .arch import window_and_shift
from .attention import Attention, _runs_in_fp16, drop_negligible_logits_
from .linear import linear
from .shifted_window import shared, shifted_window_attention
from .switch import denormals_are_slow, eager_autograd, is_tracing
from .window import relative_position_index

__all__ = ['LOGIT_SCALE_MAX', 'log_spaced_relative_coords', 'pretrained_window_of', 'cpb_mlp',
           'unit_vectors',
           'cpb_table', 'continuous_position_bias', 'CosineWindowAttention', 'ShiftWindowMSAV2']

#: With autograd, the share of padding queries from which :class:`_RealQueryAttention` skips
#: them (:meth:`CosineWindowAttention._attends_real_queries_with_autograd`): at 6 % a block
#: was slower than attending every query, at 11 % about even, from 29 % on faster.
REAL_QUERY_MIN_SKIPPED = 1. / 8

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


def unit_vectors(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``x / max(||x||, eps)`` over the last dim, in fp32 (``F.normalize``'s values), except that
    with autograd a vector of norm ``<= eps`` gives 0 **with a zero gradient**. Why: a
    zero-padded token's key is exactly 0 (the projection has no key bias), where
    ``F.normalize``'s gradient is ``1/eps`` = 1e12: inf once cast back to fp16 under autocast,
    and NaN weight gradients after ``inf * 0`` (in fp32 those entries only reach the dropped
    padding and multiply zero inputs). Without a gradient to take, ``F.normalize`` itself: 3
    ops instead of 8 (each a kernel launch on a GPU); the two differ in rounding only (and at
    norms in ``(0, eps]``, which no real token has)."""
    x = x.float()
    if not (x.requires_grad and torch.is_grad_enabled()):
        return F.normalize(x, dim=-1, eps=eps)
    return x * _reciprocal_norms(x, eps)


def _reciprocal_norms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``1 / ||x||`` over the last dim (kept), 0 where the norm is ``<= eps``: what
    :func:`unit_vectors` and :class:`_UnitQKV` multiply by."""
    sq = x.square().sum(-1, keepdim=True)
    return torch.rsqrt(sq.clamp_min(eps * eps)) * (sq > eps * eps)


class _UnitQKV(torch.autograd.Function):
    """``(q, k, v)``, each ``(B, nW * heads, N, d)``, from projected windows ``qkv: (B * nW, N,
    3C)`` (channels ordered ``(q/k/v, head, d)``): q and k as :func:`unit_vectors` (in fp32), q
    times ``scale`` ``(heads, 1, 1)``, both cast to qkv's dtype; v as it is.

    One autograd node with a written-out backward: ``grad_x = r (g - y <g, y>)`` (``y`` the unit
    vector, ``r`` one over the norm, 0 at norms ``<= eps`` as :func:`unit_vectors` gives), the
    scale's gradient ``sum(g_q * y_q)`` per head, and the three gradients written straight into
    one ``(B * nW, N, 3C)`` tensor, the layout of the windows they came from. Autograd's chain
    (the head split's copy, a split, the normalisation, the scale, the casts) instead joins
    the gradients with a concatenation, then copies them back into the windows' layout: two
    passes over ``3 x tokens x C`` per block, and the normalisation's own backward about
    twice the passes over ``2 x tokens x d`` of this one. Same values; gradients equal up to
    float rounding."""

    @staticmethod
    def forward(ctx, qkv, scale, windows, heads, eps):
        bw, n, channels = qkv.shape
        d = channels // (3 * heads)
        parts = qkv.reshape(bw // windows, windows, n, 3, heads, d)
        # q and k read once from the windows' layout into fp32 (2, B, nW, heads, N, d)
        x = qkv.new_empty((2, bw // windows, windows, heads, n, d), dtype=torch.float32)
        x.copy_(parts[:, :, :, :2].permute(3, 0, 1, 4, 2, 5))
        r = _reciprocal_norms(x, eps)
        y = x.mul_(r)
        grouped = (bw // windows, windows * heads, n, d)
        q = (y[0] * scale).to(qkv.dtype).view(grouped)
        k = y[1].to(qkv.dtype).view(grouped)
        v = parts[:, :, :, 2].transpose(2, 3).clone(memory_format=torch.contiguous_format)
        ctx.save_for_backward(y, r, scale)
        ctx.shape = qkv.shape
        ctx.in_dtype = qkv.dtype
        return q, k, v.view(grouped)

    @staticmethod
    @once_differentiable  # (the saved y and r are not differentiable functions of the input)
    def backward(ctx, grad_q, grad_k, grad_v):
        y, r, scale = ctx.saved_tensors
        b, windows, heads, n, d = y.shape[1:]
        g = torch.empty_like(y)  # (2, B, nW, heads, N, d) fp32: the gradients at the unit vectors
        g[0].copy_(grad_q.unflatten(1, (windows, heads)))
        grad_scale = None
        if ctx.needs_input_grad[1]:
            per_head = (g[0] * y[0]).sum(-1).sum(-1)
            grad_scale = per_head.reshape(-1, scale.shape[0]).sum(0).view_as(scale)
        grad_qkv = None
        if ctx.needs_input_grad[0]:
            g[0].mul_(scale)
            g[1].copy_(grad_k.unflatten(1, (windows, heads)))
            along = (g * y).sum(-1, keepdim=True)
            g.addcmul_(y, along, value=-1.).mul_(r)
            grad_qkv = y.new_empty((b, windows, n, 3, heads, d), dtype=ctx.in_dtype)
            into = grad_qkv.permute(3, 0, 1, 4, 2, 5)  # (3, B, nW, heads, N, d), a view
            into[:2].copy_(g)
            into[2].copy_(grad_v.unflatten(1, (windows, heads)))
            grad_qkv = grad_qkv.view(ctx.shape)
        return grad_qkv, grad_scale, None, None, None


def _query_groups(spans, window):
    """The blocks of windows that share their real queries' hull (:func:`~.window.
    real_query_spans`), as ``(windows, queries)``: the window rows and columns as slices of
    the window grid, the local rows and columns as slices of a window's tokens."""
    row_groups, col_groups = spans
    for r0, r1, lr0, lr1 in row_groups:
        for c0, c1, lc0, lc1 in col_groups:
            yield (slice(r0, r1), slice(c0, c1)), (slice(lr0, lr1), slice(lc0, lc1))


class RealQueryPlan(NamedTuple):
    """Where :class:`_RealQueryAttention`'s blocks read and write (:func:`real_query_plan`).

    ``rows[i]``: block i's real queries as rows of q flattened to ``(B, nW * heads * N, d)``,
    ordered (window, head, query); ``local[i]``: their local rows and columns in a window (two
    slices); ``sizes[i]``: its counts of windows, query rows and query columns; ``order``: the
    windows ordered block by block (None where that is their own order), ``inverse`` its
    inverse."""
    rows: Tuple[torch.Tensor, ...]
    local: Tuple[Tuple[slice, slice], ...]
    sizes: Tuple[Tuple[int, int, int], ...]
    order: Optional[torch.Tensor]
    inverse: Optional[torch.Tensor]

    @property
    def windows(self) -> Tuple[int, ...]:
        """The number of windows of each block (their sum: every window of the grid)."""
        return tuple(w for w, _, _ in self.sizes)


def real_query_plan(spans, window, heads: int, device) -> RealQueryPlan:
    """The :class:`RealQueryPlan` of a window grid's real queries (``spans``:
    :func:`~.window.real_query_spans`) for ``heads`` heads: a few small integer ops per block
    of windows, which the blocks of a stage share (:func:`~.shifted_window.shared`)."""
    grid_rows, grid_cols = spans[0][-1][1], spans[1][-1][1]
    n = window[0] * window[1]
    cells = torch.arange(grid_rows * grid_cols, device=device).view(grid_rows, grid_cols)
    tokens = torch.arange(n, device=device).view(window)
    head = torch.arange(heads, device=device)
    rows, local, sizes, order = [], [], [], []
    for windows, queries in _query_groups(spans, window):
        ids, block = cells[windows].reshape(-1), tokens[queries]
        at = block.reshape(-1)
        rows.append(((ids[:, None] * heads + head)[..., None] * n + at).reshape(-1))
        local.append(queries)
        sizes.append((ids.numel(), *block.shape))
        order.append(ids)
    if len(spans[1]) == 1:  # whole rows of windows, in their own order
        return RealQueryPlan(tuple(rows), tuple(local), tuple(sizes), None, None)
    order = torch.cat(order)
    return RealQueryPlan(tuple(rows), tuple(local), tuple(sizes), order, torch.argsort(order))


class _RealQueryAttention(torch.autograd.Function):
    """``softmax(q k^T + bias + mask) v`` of the queries that hold real tokens only, with
    autograd, block by block of windows sharing a hull of real queries
    (:class:`RealQueryPlan`); 0 at the skipped queries (padding, dropped by the merge).

    ``q, k, v: (B, nW * heads, N, d)`` or ``(B * nW, heads, N, d)`` (windows row-major,
    tokens row-major in a window), q already scaled; ``bias (heads, N, N)`` (the position
    bias, with a gradient; fp32 or q's dtype: cast to q's for the sums, its gradient summed in
    fp32 and returned in its own dtype), ``mask (nW, N, N)`` or None (constant, in q's
    dtype). The softmax runs in the logits' dtype, as :meth:`Attention._attend` does with
    autograd.

    Why a function of its own: with autograd, :meth:`CosineWindowAttention.
    _attend_real_queries`' blocks of strided slices cost their backwards (a zeroed full-size
    tensor per slice, then a sum), which ate the rows saved. Here each block's real queries
    are one gather of rows, its keys and values a slice of the windows in block order, its
    output and gradients one indexed write each, and the bias gradient is summed per block:
    the padding queries' rows (at the detection recipe's sizes x0.4 about half the queries
    of Swin V2's stages 3 and 4) are in no product, forward or backward. Measured (2-core AMD
    EPYC Zen 4, bf16, one SwinV2-T block forward + backward, 320x544 input): stage 3 24 %
    faster, stage 4 14 %, stage 2 13 %, stage 1 (6 % padding) 4 % slower, hence
    ``REAL_QUERY_MIN_SKIPPED``; the train step's peak memory 7-11 % lower."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, plan, window, heads, drop_negligible):
        n, d = q.shape[-2:]
        b = q.numel() // (sum(plan.windows) * heads * n * d)
        flat = q.reshape(b, -1, d)
        ordered = _windows_in_block_order((k, v), plan, b)
        keys, values = (_blocks(t, plan, heads, n) for t in ordered)
        # the bias and the mask with a query's local row and column as dims of their own: a
        # block's queries are a slice of them (no gather)
        bias4 = bias.to(q.dtype).view(heads, *window, n)
        masks = None
        if mask is not None:
            masks = (mask if plan.order is None else mask.index_select(0, plan.order)) \
                .view(-1, 1, *window, n).split(plan.windows)
        out = torch.zeros_like(flat)
        kept = []
        for i, (windows, lr, lc) in enumerate(plan.sizes):
            qb = flat.index_select(1, plan.rows[i]).view(b, windows, heads, lr * lc, d)
            logits = qb @ keys[i].transpose(-2, -1)  # (B, windows, heads, queries, N)
            tiled = logits.view(b, windows, heads, lr, lc, n)
            tiled += bias4[(slice(None), *plan.local[i])]
            if masks is not None:
                tiled += masks[i][(slice(None), slice(None), *plan.local[i])]
                if drop_negligible:
                    drop_negligible_logits_(logits)
            p = logits.softmax(-1)
            out.index_copy_(1, plan.rows[i], (p @ values[i]).view(b, -1, d))
            kept += [qb, p]
        ctx.save_for_backward(*ordered, *kept)  # (k and v in block order: no second gather)
        ctx.plan, ctx.window, ctx.heads, ctx.bias_dtype = plan, window, heads, bias.dtype
        ctx.shapes = k.shape, v.shape
        return out.view(q.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        k, v, *kept = ctx.saved_tensors
        plan, heads, (wh, ww) = ctx.plan, ctx.heads, ctx.window
        b, n, d = kept[0].shape[0], wh * ww, grad_out.shape[-1]
        keys, values = (_blocks(t, plan, heads, n) for t in (k, v))
        flat = grad_out.reshape(b, -1, d)
        dq = torch.zeros_like(flat)
        dks, dvs = [], []
        dbias = grad_out.new_zeros((heads, n, n),
                                   dtype=torch.promote_types(grad_out.dtype, torch.float32)) \
            if ctx.needs_input_grad[3] else None
        rows4 = None if dbias is None else dbias.view(heads, *ctx.window, n)
        for i in range(len(plan.sizes)):
            qb, p = kept[2 * i], kept[2 * i + 1]
            go = flat.index_select(1, plan.rows[i]).view(qb.shape)
            dvs.append(p.transpose(-2, -1) @ go)
            ds = torch._softmax_backward_data(go @ values[i].transpose(-2, -1), p, -1, p.dtype)
            dq.index_copy_(1, plan.rows[i], (ds @ keys[i]).view(b, -1, d))
            dks.append(ds.transpose(-2, -1) @ qb)
            if dbias is not None:
                # summed over images and windows as one outer reduction in the gradient's
                # dtype (4-10x faster in bf16 than asking for an fp32 result), then added in
                # fp32 at the block's query rows
                part = ds.flatten(0, 1)
                part = part[0] if part.shape[0] == 1 else part.sum(0)
                rows = rows4[(slice(None), *plan.local[i])]
                rows += part.view(rows.shape)
        dk, dv = (_windows_in_place(parts, plan).view(shape) for parts, shape in
                  ((dks, ctx.shapes[0]), (dvs, ctx.shapes[1])))
        if dbias is not None:
            dbias = dbias.to(ctx.bias_dtype)
        return dq.view(grad_out.shape), dk, dv, dbias, None, None, None, None, None


def _windows_in_block_order(tensors, plan: RealQueryPlan, b: int):
    """Each of ``tensors`` (k, v: ``(B, nW * heads, N, d)`` or ``(B * nW, heads, N, d)``) as
    ``(B, nW, heads * N * d)`` with the windows in :class:`_RealQueryAttention`'s block order
    (one gather where ``plan.order``, else a view)."""
    windows = sum(plan.windows)
    # (gathered as 3-D: index_select took 10x as long on a 5-D view)
    return [t.reshape(b, windows, -1) if plan.order is None else
            t.reshape(b, windows, -1).index_select(1, plan.order) for t in tensors]


def _blocks(t, plan: RealQueryPlan, heads: int, n: int):
    """``(B, nW, heads * N * d)`` in block order -> each block's ``(B, windows, heads, N, d)``
    (views)."""
    return t.view(*t.shape[:2], heads, n, -1).split(plan.windows, dim=1)


def _windows_in_place(parts, plan: RealQueryPlan) -> torch.Tensor:
    """Blocks ``(B, windows, heads, N, d)`` in block order -> ``(B, nW, heads, N, d)``."""
    whole = torch.cat(parts, dim=1)
    if plan.inverse is None:
        return whole
    return whole.flatten(2).index_select(1, plan.inverse)


def cpb_mlp(num_heads: int, hidden_dims: int = 512) -> nn.Sequential:
    """The position-bias MLP ``2 -> hidden -> heads`` (ReLU, no output bias): indices 0 and 2
    are the released checkpoints' ``cpb_mlp.0`` / ``cpb_mlp.2``."""
    return nn.Sequential(nn.Linear(2, hidden_dims), nn.ReLU(inplace=True),
                         nn.Linear(hidden_dims, num_heads, bias=False))


def cpb_table(mlp: nn.Module, coords: torch.Tensor) -> torch.Tensor:
    """``16 * sigmoid(mlp(coords))`` as a contiguous ``(heads, rows)`` float32 table: the MLP
    and the sigmoid run in fp32 (outside autocast), as products giving the transposed layout
    directly (``W2 relu(W1 coords^T + b1)``: no transposing copy), so that
    :func:`continuous_position_bias` indexes it along the rows."""
    first, last = mlp[0], mlp[2]
    device = coords.device.type

    def run(c):  # mlp(c) transposed, (heads, rows), as functions: no module calls
        # the coordinates transposed into a contiguous (2, rows) tensor, not a strided view:
        # the first weight's gradient, (hidden, rows) @ (rows, 2), then reads the transposed
        # view of that tensor, a product several times faster than on the (rows, 2) table
        # itself (0.06 against 0.29 ms at window 16; a SwinV2-T bf16 train step's bias-MLP
        # ops 11-12.5 instead of 16.5-17 ms; 2-core AMD EPYC Zen 4, fp32 as the MLP runs)
        hidden = torch.addmm(first.bias[:, None], first.weight, c.t().contiguous()).relu_()
        return last.weight @ hidden if last.bias is None else \
            torch.addmm(last.bias[:, None], last.weight, hidden)

    if is_autocast_enabled(device):
        with torch.autocast(device, enabled=False):
            table = run(coords.to(first.weight.dtype))
    else:
        table = run(coords.to(first.weight.dtype))
    return 16. * torch.sigmoid(table.float())


def continuous_position_bias(mlp: nn.Module, coords: torch.Tensor, index: torch.Tensor,
                             table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``16 * sigmoid(mlp(coords))`` gathered by ``index`` ``(N, N)`` -> contiguous ``(heads, N,
    N)`` float32 (``table``: :func:`cpb_table`'s result where the caller already has it).
    The gather reads the ``(heads, rows)`` table along its rows, so the result comes out in
    its final layout, with no strided copy of ``heads x N x N`` values. It runs in fp32 (its
    fp32 kernels ran 2-5x faster than the bf16 ones), as ``index_select`` along the rows: the
    values of ``gather`` with the index expanded over the heads, 1.3-2.3x faster (2-core AMD
    EPYC Zen 5, 3-24 heads, window 16)."""
    if table is None:
        table = cpb_table(mlp, coords)
    n = index.shape[0]
    return table.index_select(1, index.reshape(-1)).view(-1, n, n)


def _same_tensors(saved: Sequence[torch.Tensor], now: Sequence[torch.Tensor]) -> bool:
    """Whether ``now`` holds the values (and dtypes, shapes, devices) ``saved`` holds."""
    return len(saved) == len(now) and all(
        a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and torch.equal(a, b)
        for a, b in zip(saved, now))


class CosineWindowAttention(Attention):
    """Swin V2 attention inside windows of ``window`` tokens (see module docstring).

    Parameters (mmpretrain's ``WindowMSAV2`` / Microsoft's names): ``qkv.weight`` (no bias),
    ``q_bias``, ``v_bias`` (with ``qkv_bias``), ``logit_scale`` ``(heads, 1, 1)``, ``cpb_mlp``,
    ``proj``. Buffers (derived, not saved): ``relative_coords_table`` and
    ``relative_position_index``, rebuilt from ``window`` / ``pretrained_window``.

    ``forward(x: (B * nW, N, C), mask: (nW, N, N) or None) -> (B * nW, N, C)``.
    """

    def __init__(self, dim: int, num_heads: int, window: Sequence[int],
                 pretrained_window: Optional[Sequence[int]] = None, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0., cpb_hidden_dims: int = 512,
                 use_sdpa: bool = True):
        # the cosine logits carry their own (learnt) scale: the product is not rescaled
        super().__init__(dim, num_heads, qkv_bias=False, qk_scale=1., attn_drop=attn_drop,
                         proj_drop=proj_drop, use_sdpa=use_sdpa)
        self.window = tuple(window)
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
        self.register_buffer('relative_position_index', relative_position_index(self.window),
                             persistent=False)

    def qkv_bias(self) -> Optional[torch.Tensor]:
        """``[q_bias, 0, v_bias]`` (the key has no bias), or None."""
        if self.q_bias is None:
            return None
        return torch.cat([self.q_bias, torch.zeros_like(self.v_bias), self.v_bias])

    def position_bias(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The continuous position bias ``(heads, N, N)`` of this window in ``dtype`` (computed
        in fp32, then cast).

        In bf16 the gathered bias is kept with the table it came from (:meth:`_kept`, so under
        the same conditions and dropped with it): SDPA reads it in bf16, and gathering and
        casting ``heads x N x N`` values per block on every call cost more than the rest of
        the bias (a SwinV2-T bf16 forward 4-8 % faster with it kept; no gain in fp32, where it
        is not kept).
        """
        kept = self._kept()
        if kept is not None and dtype == torch.bfloat16 and kept['bias'] is not None:
            return kept['bias']
        table = cpb_table(self.cpb_mlp, self.relative_coords_table) if kept is None \
            else kept['table']
        bias = continuous_position_bias(self.cpb_mlp, self.relative_coords_table,
                                        self.relative_position_index, table).to(dtype)
        if kept is not None and dtype == torch.bfloat16:
            kept['bias'] = bias
        return bias

    def _bias_table(self) -> torch.Tensor:
        """:func:`cpb_table` of this block: the kept one where :meth:`_kept` keeps it."""
        kept = self._kept()
        return cpb_table(self.cpb_mlp, self.relative_coords_table) if kept is None \
            else kept['table']

    def _kept(self) -> Optional[dict]:
        """What this block keeps between eager CPU calls without autograd (None elsewhere): its
        :func:`cpb_table` (``'table'``), the bf16 bias gathered from it once a bf16 call needs
        it (``'bias'``, :meth:`position_bias`), and copies of what they were computed from.

        The table depends on the weights only, not on the input, and inference runs the same
        weights call after call: keeping it made a SwinV2-T forward 3-4 % faster in bf16 and
        2-5 % in fp32 (the detection recipe's sizes x0.4, 2-core AMD EPYC Zen 5; the MLP is
        ``rows x 2 -> 512 -> heads`` per block, on thin shapes). The record holds a copy of
        everything it was computed from (the MLP's parameters and the coordinates), and is
        reused only while those hold the same values, compared exactly: an edit of any kind (an
        optimizer step, a checkpoint load, an EMA update through ``.data``, a dtype or device
        change) replaces it. Not on other devices (the comparison would wait for the
        device), not under tracing (the graph computes it), not with autograd (gradients flow
        through the MLP).
        """
        inputs = (self.relative_coords_table, *self.cpb_mlp.parameters())
        if (is_tracing() or any(t.device.type != 'cpu' for t in inputs)
                or (torch.is_grad_enabled() and any(t.requires_grad for t in inputs))):
            return None
        kept = self.__dict__.get('_kept_table')
        if kept is None or not _same_tensors(kept['inputs'], inputs):
            kept = self.__dict__['_kept_table'] = dict(
                inputs=tuple(t.detach().clone() for t in inputs),
                table=cpb_table(self.cpb_mlp, self.relative_coords_table), bias=None)
        return kept

    def __getstate__(self):
        """Pickling and ``copy.deepcopy`` leave out what :meth:`_kept` keeps (up to heads x
        N x N values per block, recomputed from the weights on the next call)."""
        state = dict(super().__getstate__())
        state.pop('_kept_table', None)
        return state

    def _logit_scale(self) -> torch.Tensor:
        """The per-head logit scale ``exp(min(logit_scale, log 100))``, fp32 ``(heads, 1, 1)``."""
        return self.logit_scale.clamp(max=LOGIT_SCALE_MAX).exp().float()

    def normalises_at_projection(self, qkv: torch.Tensor) -> bool:
        """Whether :meth:`project` gives q and k already normalised (q times its scale), so
        that the attention does not normalise them again: in eager inference outside fp16.

        Why: the inference path projects the real tokens before the window gather
        (:func:`~.shifted_window.shifted_window_attention`), so q and k are normalised there
        once per block, on real tokens only, instead of once per block of windows that
        :meth:`_attend_real_queries` attends (up to 10 per block, each with its own small
        ops) and on the padding keys too: a SwinV2-T bf16 forward 4-6 % faster, same
        values (2-core AMD EPYC Zen 5; no change in fp32). fp16 keeps the normalisation
        inside the attention, which runs in fp32 there (q is not rounded to fp16).
        """
        return not (torch.is_grad_enabled() or is_tracing() or _runs_in_fp16(qkv))

    def _unit_qk(self, q, k, dtype):
        """q and k as unit vectors (in fp32), q times its per-head scale, cast to ``dtype``.
        Heads may share a dim with windows (``(..., nW * heads, N, d)``): the scale broadcasts
        over the heads' position in that dim."""
        return self._scaled_q(unit_vectors(q), dtype), unit_vectors(k).to(dtype)

    def _scaled_q(self, q_unit, dtype, scale=None):
        """Unit ``q`` (fp32, heads possibly sharing a dim with windows) times its per-head
        scale (``scale``: :meth:`_logit_scale`'s value where the caller has it), cast to
        ``dtype``."""
        q_unit = q_unit.unflatten(-3, (-1, self.num_heads))
        scale = self._logit_scale() if scale is None else scale
        return (q_unit * scale).flatten(-4, -3).to(dtype)

    def attend(self, q, k, v, bias, masked=False, normalised=False):
        """:meth:`Attention.attend` of cosine logits; ``normalised``: q and k come already
        normalised, q times its scale (by :meth:`project` where
        :meth:`normalises_at_projection`, else by :meth:`attend_windows`)."""
        if normalised:
            return self._attend_unit(q, k, v, bias, masked)
        return super().attend(q, k, v, bias, masked)

    def _attend(self, q, k, v, bias, masked=False):
        """Cosine logits: q and k unit-normalised (in fp32) and q scaled per head, then the
        plain attention with a unit scale."""
        q, k = self._unit_qk(q, k, v.dtype)
        return self._attend_unit(q, k, v, bias, masked)

    def _attend_unit(self, q, k, v, bias, masked=False):
        if (self.use_sdpa and q.dtype == torch.bfloat16 and q.device.type == 'cpu'
                and not (bias is not None and bias.requires_grad)):
            # bf16 on CPU, unlike V1's 7x7 windows (Attention._attend): at V2's windows (16x16:
            # N = 256) the fused kernel took a fifth to a half of matmul + fp32 softmax's time
            # (2 cores, torch 2.13), and it keeps the logits (cosines times up to 100) in fp32
            # where the explicit path rounds q k^T to bf16 first
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if bias is None else bias.to(q.dtype),
                dropout_p=self.attn_drop if self.training else 0., scale=1.)
        return super()._attend(q, k, v, bias, masked)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The q/k/v projection ``(..., C) -> (..., 3C)`` (:meth:`project_with_zero`'s first)."""
        return self.project_with_zero(x)[0]

    def project_with_zero(self, x: torch.Tensor):
        """``(qkv, zero)``: the q/k/v projection ``(..., C) -> (..., 3C)``, and what it gives
        for an all-zero token (the raw ``[q_bias, 0, v_bias]``, built once for both; None
        without biases). Where :meth:`normalises_at_projection`, q and k come out normalised
        (in place: no autograd there), with the values the attention would give them; ``zero``
        stays the raw bias: a padding token's key is 0 either way, and a padding query's
        output is dropped."""
        bias = self.qkv_bias()
        qkv = linear(x, self.qkv.weight, bias)
        if self.normalises_at_projection(qkv):
            parts = qkv.view(*qkv.shape[:-1], 3, self.num_heads, self.head_dim)
            # q and k in one pass (fp32), q scaled there, then one copy back: the values of
            # normalising each and casting once; the scale's (heads, 1, 1) read with heads in
            # the second-to-last dim
            unit = unit_vectors(parts[..., :2, :, :])
            unit[..., 0, :, :] *= self._logit_scale()[..., 0]
            parts[..., :2, :, :] = unit
        return qkv, bias

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.output(self.attend_windows(self.project(x), mask))

    def attend_windows(self, qkv: torch.Tensor, mask: Optional[torch.Tensor] = None,
                       real_queries=None) -> torch.Tensor:
        """Attention of projected windows ``qkv: (B * nW, N, 3C)`` -> ``(B * nW, N, C)``, heads
        merged, before the output projection. ``real_queries``: which queries hold real
        tokens (:func:`~.window.real_query_spans`); only those are attended, and the outputs
        of the others (padding, which the merge drops) are 0."""
        bw, n, _ = qkv.shape
        nw = 1 if mask is None else mask.shape[0]
        heads, head_dim = self.num_heads, self.head_dim
        # In bf16 the logits the bias is added to are bf16 (SDPA reads its bias in q's dtype;
        # with autograd the explicit path adds it in the logits' dtype), so the bias is built
        # there: the per-window sum is nW * heads * 256 * 256 values per block at window 16,
        # half the bytes, and no fp32 sum to cast. A masked entry (-100 + bias) may then round
        # differently; its weight is below e**-80 either way.
        grads = torch.is_grad_enabled() and any(p.requires_grad for p in self.cpb_mlp.parameters())
        low = qkv.dtype == torch.bfloat16 and (self.use_sdpa or grads)
        dtype = qkv.dtype if low else torch.float32
        # where :class:`_RealQueryAttention` may take it, the bias stays fp32: the function
        # casts it for its sums and returns its gradient in fp32, where a cast outside would
        # round that gradient to bf16 and cast it back (two passes over heads x N x N per block)
        may_take = real_queries is not None and eager_autograd(qkv, self.logit_scale,
                                                               *self.cpb_mlp.parameters())
        position = self.position_bias(torch.float32 if may_take else dtype)
        if mask is not None:
            mask = mask.to(dtype)
        # windows and heads share one dim: 4-D inputs keep SDPA on its fused kernel, and the
        # (1, nW * heads, N, N) bias broadcasts over the images without a copy
        normalised = self.normalises_at_projection(qkv)
        scale = None if normalised or _runs_in_fp16(qkv) else self._logit_scale()
        if scale is not None and eager_autograd(qkv, scale):
            q, k, v = _UnitQKV.apply(qkv, scale, nw, heads, 1e-12)
            normalised = True
        else:
            stacked = qkv.view(bw // nw, nw, n, 3, heads, head_dim).permute(3, 0, 1, 4, 2, 5) \
                .reshape(3, bw // nw, nw * heads, n, head_dim)  # (a copy: nW and heads merge)
            if scale is None:  # (normalised at the projection; fp16: inside, in fp32)
                q, k, v = stacked.unbind(0)
            else:
                # q and k normalised as one tensor: half the ops of normalising each, each a
                # kernel launch on a GPU; same values (split, unbind and squeeze, not
                # indexing: their backwards are one concatenation each, where an index's is a
                # zeroed full-size tensor per part, then a sum)
                qk, v = stacked.split((2, 1))
                q, k = unit_vectors(qk).unbind(0)
                q, k = self._scaled_q(q, qkv.dtype, scale), k.to(qkv.dtype)
                v = v.squeeze(0)
                normalised = True
        if may_take and eager_autograd(q, k, v, position):
            if self._attends_real_queries_with_autograd(q, dtype, real_queries):
                plan = shared(('real queries', real_queries, self.window, heads, q.device),
                              lambda: real_query_plan(real_queries, self.window, heads, q.device))
                out = _RealQueryAttention.apply(
                    q, k, v, position, mask, plan, self.window, heads,
                    mask is not None and denormals_are_slow(q.device))
                return self.merge_heads(out.reshape(bw, heads, n, head_dim))
            real_queries = None  # (the blocks below cost more than they save with autograd)
        position = position.to(dtype)
        # one bias per window and head, (1, nW * heads, N, N)
        bias = position if mask is None else mask.unsqueeze(1) + position
        bias = bias.reshape(1, nw * heads, n, n)
        if real_queries is None:
            out = self.attend(q, k, v, bias, masked=mask is not None, normalised=normalised)
        else:
            out = self._attend_real_queries(q, k, v, bias, mask is not None, real_queries,
                                            normalised)
        return self.merge_heads(out.reshape(bw, heads, n, head_dim))

    def _attends_real_queries_with_autograd(self, q, dtype: torch.dtype, spans) -> bool:
        """Whether :class:`_RealQueryAttention` attends the real queries where autograd
        records the attention: with q and k normalised, the logits in q's dtype (``dtype``,
        not fp16, which attends in fp32), without attention dropout, and where the queries it
        skips (those outside the real ones' hulls: ``spans``) are at least
        ``REAL_QUERY_MIN_SKIPPED`` of all (below that its blocks cost about what the rows saved
        do). Elsewhere every query is attended."""
        if q.dtype != dtype or _runs_in_fp16(q) or (self.training and self.attn_drop):
            return False
        (row_groups, col_groups), (wh, ww) = spans, self.window
        real = sum((r1 - r0) * (h1 - h0) for r0, r1, h0, h1 in row_groups) * \
            sum((c1 - c0) * (w1 - w0) for c0, c1, w0, w1 in col_groups)
        return 1. - real / (row_groups[-1][1] * wh * col_groups[-1][1] * ww) \
            >= REAL_QUERY_MIN_SKIPPED

    def _attend_real_queries(self, q, k, v, bias, masked: bool, spans,
                             normalised: bool = False) -> torch.Tensor:
        """:meth:`attend` of the queries that hold real tokens only, block by block of windows
        (``spans``: :func:`~.window.real_query_spans`); returns q's layout, 0 at the skipped
        queries.

        Why: small maps are padded to whole windows (SwinV2-T, window 16, a 288 x 448 input:
        18 x 28 tokens at stride 16 padded to 32 x 32, 9 x 14 at stride 32 to 16 x 16), and
        a padding query costs as much as a real one. Keys and values stay whole: padding
        tokens are attended to, as in every reference Swin. At the detection recipe's sizes
        scaled by 0.4 about a third of the queries are padding.

        Layouts as :meth:`attend_windows` passes them: masked ``(B, nW * heads, N, d)``,
        unmasked ``(B * nW, heads, N, d)``; both view as ``(B, rows, cols, heads, Wh, Ww, d)``
        (the window grid, the tokens' grid), and a block goes back to 4-D the same way
        (windows joined with the heads, or with the images). Where the columns split into
        groups, the window rows go one at a time, so that the blocks of k and v stay views.
        """
        (row_groups, col_groups), (wh, ww) = spans, self.window
        rows, cols, heads = row_groups[-1][1], col_groups[-1][1], self.num_heads
        join = 1 if masked else 0

        def grid(t, tokens):  # (B, rows, cols, heads, *tokens, last)
            return t.reshape(-1, rows, cols, heads, *tokens, t.shape[-1])

        def four(t):  # a block (B, kr, kc, heads, [lr, lc,] x) -> 4-D
            t = t.flatten(1, 2)
            if t.dim() == 6:
                t = t.flatten(3, 4)
            return t.flatten(join, join + 1)

        q7, k6, v6 = grid(q, (wh, ww)), grid(k, (wh * ww, )), grid(v, (wh * ww, ))
        per_window = bias.shape[1] > heads  # else one bias for every window
        bias7 = bias.reshape(1, -1, cols if per_window else 1, heads, wh, ww, bias.shape[-1])
        images, out = q7.shape[0], None
        for r0, r1, lr0, lr1 in row_groups:
            runs = [(r0, r1)] if len(col_groups) == 1 else [(r, r + 1) for r in range(r0, r1)]
            for a, b in runs:
                for c0, c1, lc0, lc1 in col_groups:
                    block = (slice(None), slice(a, b), slice(c0, c1))
                    bias_block = bias7[block] if per_window else bias7
                    got = self.attend(four(q7[block][..., lr0:lr1, lc0:lc1, :]),
                                      four(k6[block]), four(v6[block]),
                                      four(bias_block[..., lr0:lr1, lc0:lc1, :]),
                                      masked=masked, normalised=normalised)
                    if out is None:
                        out = got.new_zeros(q7.shape)
                    out[block + (slice(None), slice(lr0, lr1), slice(lc0, lc1))] = \
                        got.reshape(images, b - a, c1 - c0, heads, lr1 - lr0, lc1 - lc0, -1)
        return out.reshape(q.shape)


class ShiftWindowMSAV2(nn.Module):
    """W-MSA (``shift`` all zero) or SW-MSA of :class:`CosineWindowAttention` over
    ``x: (B, H, W, C)``; the attention module is ``w_msa`` (mmpretrain's keys)."""

    def __init__(self, embed_dims: int, num_heads: int, window: Sequence[int],
                 shift: Sequence[int], pretrained_window: Optional[Sequence[int]] = None,
                 qkv_bias: bool = True, attn_drop: float = 0., proj_drop: float = 0.,
                 cpb_hidden_dims: int = 512):
        super().__init__()
        self.window, self.shift = window_and_shift(window, shift)
        self.w_msa = CosineWindowAttention(embed_dims, num_heads, self.window, pretrained_window,
                                           qkv_bias=qkv_bias, attn_drop=attn_drop,
                                           proj_drop=proj_drop, cpb_hidden_dims=cpb_hidden_dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return shifted_window_attention(x, self.w_msa, self.window, self.shift)


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
        side = grid.shape[axis]
        if side < 3:
            out.append(0)
            continue
        centre = [(grid.shape[0] - 1) // 2, (grid.shape[1] - 1) // 2]
        centre[axis] += 1
        value = float(grid[centre[0], centre[1], axis])
        out.append(int(round(8. / (2.**(3. * value) - 1.) + 1.)))
    return tuple(out)

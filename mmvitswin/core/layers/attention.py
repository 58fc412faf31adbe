"""The one multi-head attention module of the project.

``Attention`` projects ``x: (..., N, C)`` to q/k/v, adds an optional additive bias (relative
position bias, shift mask, or both) and runs ``F.scaled_dot_product_attention``; the plain
matmul + softmax path gives the same numbers and is taken when the bias needs a gradient, for
bf16 on CPU (where it is the faster of the two), or with ``use_sdpa=False``.
``WindowAttention`` adds the learned N-D relative-position bias table used by Swin (2-D and
3-D) and windowed ViT blocks.

Mixed precision: in fp16 (autocast or an fp16 model) the logits and the softmax run in fp32 and
the result is cast back, so large logits cannot overflow; bf16 has fp32's range and runs as is
(in inference its softmax runs in fp32).
Masked logits (Swin's shift mask adds -100, as the references do): on the explicit path, logits
more than ``MASKED_LOGIT_FLOOR`` below their row's maximum are set to -inf before the softmax.
Their softmax weight is under e**-80 (about 1.8e-35) either way, but left as they are those
weights are denormal floats, and every op that reads them (softmax, the product with v, the
backward) runs 4-35x slower on Intel's x86 CPUs (docs/benchmarks.md, "Denormal attention
weights"). Only there (``switch.denormals_are_slow``): on AMD's Zen 4 denormals cost nothing
extra and the drop itself made masked window attention 7-44 % slower, and GPUs have no penalty
either. The references' -100 is kept, so a masked logit that comes within 80 of its row's
maximum keeps its weight exactly as in the references.
On CUDA, eager calls leave cuDNN's SDPA backend out (:func:`~..compat.sdpa_without_cudnn`):
torch 2.11 picked it for bf16 with a mask on an H200, and it builds a plan for every new
shape, about 10 ms per call: 344 of the 434 ms of a batch-1 SwinV2-T bf16 forward at a new
size went to its 36 calls, against 2.6 ms at a size seen before, and the whole forward took
12 times its seen-size time (Swin-T 4 times). In fp32, where torch takes the memory-efficient
kernel, a new size cost about what a seen one does. With variable input sizes (multi-scale
training, evaluation at each image's own size) almost every size is new. Traced calls
(compile, export) leave the choice to torch.
Nothing here keeps state between calls: the gathered bias and the per-window mask are rebuilt
on every call (small next to the attention itself), broadcast over the batch, never stored.
"""
import contextlib
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..compat import get_autocast_dtype, is_autocast_enabled, sdpa_without_cudnn
from .linear import Linear
from .switch import denormals_are_slow, is_tracing
from .window import relative_position_index


def _runs_in_fp16(q: torch.Tensor) -> bool:
    """Whether attention on ``q`` would compute its logits in fp16."""
    if q.dtype == torch.float16:
        return True
    device = q.device.type
    return (q.dtype == torch.float32 and is_autocast_enabled(device)
            and get_autocast_dtype(device) == torch.float16)


# bf16 on CPU: from this many tokens per sequence on, SDPA's fused kernel (no N x N logits in
# memory) is used; below it the explicit form (docs/benchmarks.md, "Attention in bf16").
SDPA_BF16_CPU_MIN_TOKENS = 512

# Logits this far below their row's maximum get weight 0 instead of under e**-80 (module docs).
MASKED_LOGIT_FLOOR = 80.0


def drop_negligible_logits_(attn: torch.Tensor) -> torch.Tensor:
    """Set the logits of ``attn`` (in place) that lie more than ``MASKED_LOGIT_FLOOR`` below
    their row's maximum to -inf: their softmax weights become exact zeros instead of denormal
    floats (module docstring). The row maximum itself is never dropped, so no row is all -inf.
    In place on a tensor autograd does not keep (the sum of the logits and the bias): the
    backward keeps only the boolean mask."""
    plain = attn.detach()
    return attn.masked_fill_(plain < plain.amax(-1, keepdim=True) - MASKED_LOGIT_FLOOR,
                             float('-inf'))


def _sdpa_pays(q: torch.Tensor) -> bool:
    """Whether ``F.scaled_dot_product_attention`` beats the explicit form for ``q``. Always,
    except bf16 on CPU at window-sized sequences, where its fused kernel was measured about
    1.4x slower than matmul + softmax (2-core AVX-512, torch 2.13); for global attention over
    ``SDPA_BF16_CPU_MIN_TOKENS`` tokens or more it is about 3x faster (2-core Intel Xeon with
    AMX, 576-2000 tokens), as it never holds the N x N logits. While tracing, the explicit
    form (a size-dependent choice would be a guard, and a recompile where sizes cross it)."""
    if not (q.dtype == torch.bfloat16 and q.device.type == 'cpu'):
        return True
    return not is_tracing() and q.shape[-2] >= SDPA_BF16_CPU_MIN_TOKENS


class Attention(nn.Module):
    """Multi-head self-attention over the second-to-last dim.

    Args:
        dim: channels C.
        num_heads: heads; ``dim`` must be divisible by it.
        qkv_bias: add a learnable bias to q, k, v.
        qk_scale: override of the default ``head_dim ** -0.5`` scale.
        attn_drop: dropout on attention weights (training only).
        proj_drop: dropout after the output projection.
        use_sdpa: use ``F.scaled_dot_product_attention`` (default) or the explicit form.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, attn_drop: float = 0.,
                 proj_drop: float = 0., use_sdpa: bool = True):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f'embed_dims ({dim}) must be divisible by num_heads ({num_heads})')
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = qk_scale or self.head_dim**-0.5
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.use_sdpa = use_sdpa

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               bias: Optional[torch.Tensor], masked: bool = False) -> torch.Tensor:
        """q, k, v: (..., heads, N, head_dim); bias broadcastable to (..., heads, N, N).
        ``masked``: the bias holds a mask (large negative entries), whose negligible weights the
        explicit path drops (module docstring).

        SDPA unless ``use_sdpa`` is off or the bias needs a gradient: SDPA's fused CPU kernel has
        no gradient for the mask and would fall back to its slower math path, so the explicit
        form is used then; both give the same numbers. fp16 runs in fp32 (module docstring).
        """
        if _runs_in_fp16(q):
            dtype = q.dtype if q.dtype == torch.float16 else torch.float16
            with torch.autocast(q.device.type, enabled=False):
                out = self._attend(q.float(), k.float(), v.float(),
                                   None if bias is None else bias.float(), masked)
            return out.to(dtype)
        return self._attend(q, k, v, bias, masked)

    def _attend(self, q, k, v, bias, masked=False):
        drop = self.attn_drop if self.training else 0.
        if self.use_sdpa and _sdpa_pays(q) and not (bias is not None and bias.requires_grad):
            if bias is not None and bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            # on CUDA no per-shape cuDNN plans (module docstring)
            with (sdpa_without_cudnn() if q.is_cuda and not is_tracing()
                  else contextlib.nullcontext()):
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=bias, dropout_p=drop, scale=self.scale)
        attn = q @ k.transpose(-2, -1)
        if self.scale != 1.:  # (cosine attention scales q itself: no pass over N x N then)
            # scaling the product in place saves keeping a scaled copy of q for backward
            attn = attn.mul_(self.scale)
        # Half-precision logits: in inference the softmax runs in fp32 (faster on CPU, and
        # exact); with autograd it stays in the logits' dtype so that the probabilities kept
        # for backward take half the memory.
        keep_dtype = attn.requires_grad or (bias is not None and bias.requires_grad)
        if bias is not None:
            if keep_dtype:
                bias = bias.to(attn.dtype)
            if not is_tracing() and bias.dtype == attn.dtype and \
                    torch.broadcast_shapes(bias.shape, attn.shape) == attn.shape:
                # in place: the product's backward keeps q and k, not its output, so autograd
                # allows it; one N x N tensor less per call. Not while tracing: comparing
                # symbolic shapes would add guards, and the compiled graph places its
                # buffers itself
                attn = attn.add_(bias)
            else:  # (a bias in another dtype promotes the logits, as before)
                attn = attn + bias
            if masked and denormals_are_slow(attn.device):
                attn = drop_negligible_logits_(attn)
        half = attn.dtype in (torch.float16, torch.bfloat16)
        attn = attn.softmax(dim=-1, dtype=torch.float32 if half and not keep_dtype else None)
        if drop:
            attn = F.dropout(attn, drop, training=True)
        return attn.to(v.dtype) @ v

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The joint q/k/v projection ``(..., C) -> (..., 3C)``."""
        return self.qkv(x)

    def project_with_zero(self, x: torch.Tensor):
        """``(project(x), zero)``: ``zero`` is what :meth:`project` gives for an all-zero
        token ``(3C,)``, the projection's bias (None: no bias, so zero)."""
        return self.project(x), self.qkv.bias

    def split_heads(self, qkv: torch.Tensor):
        """qkv: (B, N, 3C) -> q, k, v: (B, heads, N, head_dim), strided views."""
        b, n, _ = qkv.shape
        return qkv.view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def qkv_heads(self, x: torch.Tensor):
        """x: (B, N, C) -> q, k, v: (B, heads, N, head_dim), strided views of one projection."""
        return self.split_heads(self.project(x))

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """out: (B, heads, N, head_dim) -> (B, N, C), before the output projection."""
        b, _, n, _ = out.shape
        return out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The output projection (and its dropout) of merged heads ``(..., C)``."""
        return self.proj_drop(self.proj(out))

    def out_proj(self, out: torch.Tensor) -> torch.Tensor:
        """out: (B, heads, N, head_dim) -> (B, N, C) through the output projection."""
        return self.output(self.merge_heads(out))

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B, N, C) -> (B, N, C). ``bias``: additive, broadcastable to (B, heads, N, N)."""
        return self.out_proj(self.attend(*self.qkv_heads(x), bias))


class WindowAttention(Attention):
    """Attention inside windows of size ``window`` (N-D) with a relative position bias.

    The bias table has ``prod(2 * w - 1)`` rows and one column per head. Its gather index is a
    derived buffer: it is saved (mmdet/mmaction2 checkpoints carry it, and strict loading needs
    the key) but always rebuilt from ``window`` rather than trusted from a checkpoint.

    ``forward(x, mask)`` takes ``x: (B * nW, N, C)`` and an optional shift mask ``(nW, N, N)``.
    """

    def __init__(self, dim: int, num_heads: int, window: Sequence[int], **kwargs):
        super().__init__(dim, num_heads, **kwargs)
        self.window = tuple(window)
        table_rows = 1
        for w in self.window:
            table_rows *= 2 * w - 1
        self.relative_position_bias_table = nn.Parameter(torch.zeros(table_rows, num_heads))
        self.register_buffer('relative_position_index', relative_position_index(self.window))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + 'relative_position_index'
        if key in state_dict:
            state_dict[key] = self.relative_position_index.clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def relative_bias(self, n: int) -> torch.Tensor:
        """The gathered bias ``(heads, n, n)`` in the table's dtype.

        ``n`` smaller than the full window (a window clamped to a small input) uses the leading
        ``n x n`` block of the index, as mmaction2's video Swin does.
        """
        # narrow, not ``[:n, :n]``: the length stays ``n`` under compile (a slice's is min(n, N))
        index = self.relative_position_index.narrow(0, 0, n).narrow(1, 0, n).reshape(-1)
        bias = self.relative_position_bias_table.index_select(0, index).view(n, n, -1)
        return bias.permute(2, 0, 1)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B * nW, N, C) windows; mask: (nW, N, N) shift mask or None -> (B * nW, N, C)."""
        return self.output(self.attend_windows(self.project(x), mask))

    def attend_windows(self, qkv: torch.Tensor, mask: Optional[torch.Tensor] = None,
                       real_queries=None) -> torch.Tensor:
        """Attention of projected windows ``qkv: (B * nW, N, 3C)`` (mask as :meth:`forward`)
        -> ``(B * nW, N, C)``, heads merged, before the output projection. ``real_queries``
        (:func:`~.window.real_query_spans`) is not used here: every query is attended (the
        windows of 7 of the V1 Swins leave little padding)."""
        bw, n, _ = qkv.shape
        bias = self.relative_bias(n)
        if mask is None:
            # q, k, v stay strided views of the projection output; a 4-D bias keeps SDPA on
            # its fused kernel (a 3-D one would send it to the math path).
            q, k, v = self.split_heads(qkv)
            return self.merge_heads(self.attend(q, k, v, bias.unsqueeze(0)))
        nw = mask.shape[0]
        b = bw // nw
        # One bias per window and head, (nW, heads, N, N), broadcast over the images.
        window_bias = bias.unsqueeze(0) + mask.to(bias.dtype).unsqueeze(1)
        qkv = qkv.view(b, nw, n, 3, self.num_heads, self.head_dim)
        if self.use_sdpa and _sdpa_pays(qkv) and not window_bias.requires_grad:
            # The fused kernel wants 4-D inputs: windows and heads share one dim, so the
            # (1, nW * heads, N, N) bias broadcasts over the batch without being copied.
            q, k, v = qkv.permute(3, 0, 1, 4, 2, 5).reshape(3, b, nw * self.num_heads, n,
                                                           self.head_dim).unbind(0)
            out = self.attend(q, k, v, window_bias.reshape(1, nw * self.num_heads, n, n),
                              masked=True)
        else:
            q, k, v = qkv.permute(3, 0, 1, 4, 2, 5).unbind(0)  # (B, nW, heads, N, d) views
            out = self.attend(q, k, v, window_bias, masked=True)
        return self.merge_heads(out.reshape(bw, self.num_heads, n, self.head_dim))

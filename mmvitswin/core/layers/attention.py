"""Multi-head attention: the one attention function, ``Attention`` and Swin's ``WindowAttention``.

:func:`attention` is where the choice between ``F.scaled_dot_product_attention`` and the
explicit ``softmax(q k^T * scale + bias) v`` is made, once for the whole package: SDPA unless
the module was built with ``fused_attn=False`` (as timm's ``fused_attn`` switch). fp16 runs
in fp32 on the explicit path (the logits could overflow); SDPA's kernels accumulate in fp32.
On CUDA, eager calls leave cuDNN's SDPA backend out (:func:`~..compat.sdpa_without_cudnn`): it
plans every new shape (about 10 ms a call on a recent GPU), and detection feeds a new size almost
every iteration.
"""
import contextlib
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..compat import (autocast_off, get_autocast_dtype, is_autocast_enabled, is_tracing,
                      sdpa_without_cudnn)
from .window import WindowPlan, merge_windows, partition_windows, relative_position_index


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              bias: Optional[torch.Tensor] = None, scale: Optional[float] = None,
              dropout: float = 0., fused: bool = True) -> torch.Tensor:
    """``softmax(q k^T * scale + bias) v`` for ``q, k, v: (..., N, d)`` and an additive
    ``bias`` broadcastable to ``(..., N, N)`` (cast to q's dtype); ``scale`` defaults to
    ``d ** -0.5``."""
    if bias is not None:
        bias = bias.to(q.dtype)
    if fused:
        cudnn_free = q.is_cuda and not is_tracing()
        with sdpa_without_cudnn() if cudnn_free else contextlib.nullcontext():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout,
                                                  scale=scale)
    device = q.device.type
    if q.dtype == torch.float16 or (is_autocast_enabled(device)
                                    and get_autocast_dtype(device) == torch.float16):
        # in fp32, outside autocast (which would cast back to fp16)
        with autocast_off(device):
            out = _explicit(q.float(), k.float(), v.float(),
                            None if bias is None else bias.float(), scale, dropout)
        return out.half()
    return _explicit(q, k, v, bias, scale, dropout)


def _explicit(q, k, v, bias, scale, dropout):
    logits = (q * (q.shape[-1]**-0.5 if scale is None else scale)) @ k.transpose(-2, -1)
    if bias is not None:
        logits = logits + bias
    weights = logits.softmax(-1)
    if dropout:
        weights = F.dropout(weights, dropout)
    return weights @ v


class Attention(nn.Module):
    """Multi-head self-attention over the second-to-last dim of ``x: (B, N, C)``.

    Args:
        dim: channels C.
        num_heads: heads; ``dim`` must be divisible by it.
        qkv_bias: a learnable bias on q, k, v.
        qk_scale: override of the default ``head_dim ** -0.5`` scale.
        attn_drop: dropout on the attention weights (training only).
        proj_drop: dropout after the output projection.
        fused_attn: ``F.scaled_dot_product_attention`` (default) or the explicit form.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, attn_drop: float = 0.,
                 proj_drop: float = 0., fused_attn: bool = True):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f'embed_dims ({dim}) must be divisible by num_heads ({num_heads})')
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = qk_scale or self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.fused_attn = fused_attn

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               bias: Optional[torch.Tensor] = None, scale: Optional[float] = None):
        """:func:`attention` with this module's scale, dropout and SDPA choice."""
        return attention(q, k, v, bias, self.scale if scale is None else scale,
                         self.attn_drop if self.training else 0., self.fused_attn)

    def qkv_heads(self, x: torch.Tensor):
        """x: (B, N, C) -> q, k, v: (B, heads, N, head_dim), strided views of one projection."""
        b, n, _ = x.shape
        return self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4) \
            .unbind(0)

    def out_proj(self, out: torch.Tensor) -> torch.Tensor:
        """out: (B, heads, N, head_dim) -> (B, N, C) through the output projection."""
        b, _, n, _ = out.shape
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, self.num_heads *
                                                                     self.head_dim)))

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B, N, C) -> (B, N, C). ``bias``: additive, broadcastable to (B, heads, N, N)."""
        return self.out_proj(self.attend(*self.qkv_heads(x), bias))


def window_heads(windows: torch.Tensor, num_windows: int, num_heads: int) -> torch.Tensor:
    """Projected windows ``(B * nW, N, 3C)`` -> q, k, v stacked, ``(3, B, nW * heads, N, d)``:
    windows and heads share one dim, so that a per-window bias ``(1, nW * heads, N, N)``
    broadcasts over the images and the inputs stay 4-D (SDPA's fused kernels need 4-D)."""
    bw, n, c3 = windows.shape
    d = c3 // (3 * num_heads)
    return windows.view(bw // num_windows, num_windows, n, 3, num_heads, d) \
        .permute(3, 0, 1, 4, 2, 5).reshape(3, bw // num_windows, num_windows * num_heads, n, d)


def windows_from_heads(out: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Attention output ``(B, nW * heads, N, d)`` (any memory layout: CUDA's kernels return
    heads interleaved) -> ``(B * nW, N, heads * d)``."""
    n, d = out.shape[-2:]
    return out.reshape(-1, num_heads, n, d).transpose(1, 2).reshape(-1, n, num_heads * d)


class WindowAttention(Attention):
    """(Shifted-)window attention with Swin's learned relative-position bias (2-D or 3-D).

    The bias table has ``prod(2w - 1)`` rows and one column per head; its gather index is a
    derived buffer, saved (mmdet/mmaction2 checkpoints carry it, strict loading needs the key)
    but always rebuilt from ``window``.

    ``forward(x: (B, *spatial, C), plan)``: q/k/v are projected on the real tokens without
    the projection's bias, gathered to windows (padding entries 0), and the bias is added to
    every entry (a zero padding token projects to the bias): the references' projection of
    the padded windows, without the padding's rows in the product. Then attention with the
    position bias and ``plan.mask``, the gather back, and the output projection on the real
    tokens.
    """

    def __init__(self, dim: int, num_heads: int, window: Sequence[int],
                 position_table: bool = True, **kwargs):
        super().__init__(dim, num_heads, **kwargs)
        self.window = tuple(window)
        # (Swin V2 computes its bias with an MLP instead, and saves no index)
        self.register_buffer('relative_position_index', relative_position_index(self.window),
                             persistent=position_table)
        if position_table:
            rows = 1
            for w in self.window:
                rows *= 2 * w - 1
            self.relative_position_bias_table = nn.Parameter(torch.zeros(rows, num_heads))
            nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + 'relative_position_index'
        if key in state_dict:
            state_dict[key] = self.relative_position_index.clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def gather_bias(self, table: torch.Tensor, n: int) -> torch.Tensor:
        """``table (rows, heads)`` gathered to ``(heads, n, n)``; ``n`` below the full window
        (a window clamped to a small input) takes the leading ``n x n`` block of the index, as
        mmaction2 does (``narrow``, not a slice: the length stays ``n`` under compile)."""
        index = self.relative_position_index.narrow(0, 0, n).narrow(1, 0, n).reshape(-1)
        return table.index_select(0, index).view(n, n, -1).permute(2, 0, 1)

    def position_bias(self, n: int) -> torch.Tensor:
        """The relative-position bias ``(heads, n, n)``."""
        return self.gather_bias(self.relative_position_bias_table, n)

    def qkv_bias(self) -> Optional[torch.Tensor]:
        """The q/k/v projection's bias ``(3C,)`` (None: none)."""
        return self.qkv.bias

    def attend_windows(self, windows: torch.Tensor, mask: Optional[torch.Tensor]):
        """Projected windows ``(B * nW, N, 3C)`` and the shift mask ``(nW, N, N)`` (or None)
        -> ``(B, nW * heads, N, d)``."""
        nw = 1 if mask is None else mask.shape[0]
        q, k, v = window_heads(windows, nw, self.num_heads).unbind(0)
        bias = self.position_bias(windows.shape[1])
        if mask is not None:
            bias = bias + mask[:, None]
        return self.attend(q, k, v, bias.reshape(1, -1, *bias.shape[-2:]))

    def forward(self, x: torch.Tensor, plan: WindowPlan) -> torch.Tensor:
        """x: (B, *spatial, C) -> (B, *spatial, C), attended in the windows of ``plan``."""
        windows = partition_windows(F.linear(x, self.qkv.weight), plan)
        bias = self.qkv_bias()
        if bias is not None:
            windows = windows + bias.to(windows.dtype)
        out = self.attend_windows(windows, plan.mask)
        out = merge_windows(windows_from_heads(out, self.num_heads), plan, x.shape)
        return self.proj_drop(self.proj(out))

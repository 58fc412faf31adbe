"""The one multi-head attention module of the project.

``Attention`` projects ``x: (..., N, C)`` to q/k/v, adds an optional additive bias (relative
position bias, shift mask, or both) and runs ``F.scaled_dot_product_attention``; the plain
matmul + softmax path (``use_sdpa=False``) gives the same numbers and exists for debugging and
for references that need the attention weights. ``WindowAttention`` adds the learned
N-D relative-position bias table used by Swin (2-D and 3-D) and windowed ViT blocks.
"""
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .linear import linear
from .window import relative_position_index


class Attention(nn.Module):
    """Multi-head self-attention over the second-to-last dim.

    Args:
        dim: channels C.
        num_heads: heads; ``dim`` must be divisible by it.
        qkv_bias: add a learnable bias to q, k, v.
        qk_scale: override of the default ``head_dim ** -0.5`` scale.
        attn_drop: dropout on attention weights (training only).
        proj_drop: dropout after the output projection.
        use_sdpa: use ``F.scaled_dot_product_attention`` (default) or the explicit fallback.
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
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.use_sdpa = use_sdpa

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               bias: Optional[torch.Tensor]) -> torch.Tensor:
        """q, k, v: (..., heads, N, head_dim); bias broadcastable to (..., heads, N, N).

        SDPA unless ``use_sdpa`` is off or the bias needs a gradient: SDPA's fused CPU kernel has
        no gradient for the mask and would fall back to its slower math path (with extra safety
        passes), so the explicit form is used then; both give the same numbers.
        """
        drop = self.attn_drop if self.training else 0.
        if self.use_sdpa and not (bias is not None and bias.requires_grad):
            if bias is not None and bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=drop, scale=self.scale)
        # scaling the product in place saves keeping a scaled copy of q for backward
        attn = (q @ k.transpose(-2, -1)).mul_(self.scale)
        if bias is not None:
            attn = attn + bias
        attn = attn.softmax(dim=-1)
        if drop:
            attn = F.dropout(attn, drop, training=True)
        return attn @ v

    def qkv_heads(self, x: torch.Tensor):
        """x: (B, N, C) -> q, k, v: (B, heads, N, head_dim), strided views of one projection."""
        b, n, _ = x.shape
        qkv = linear(x, self.qkv.weight, self.qkv.bias)
        return qkv.view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def out_proj(self, out: torch.Tensor) -> torch.Tensor:
        """out: (B, heads, N, head_dim) -> (B, N, C) through the output projection."""
        b, _, n, _ = out.shape
        out = out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)
        return self.proj_drop(linear(out, self.proj.weight, self.proj.bias))

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
        self._bias_cache = None  # (key, tensor): the gathered bias when no grad is needed
        self._masked_cache = None  # (mask, bias, batch, per-window bias) likewise
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + 'relative_position_index'
        if key in state_dict:
            state_dict[key] = self.relative_position_index.clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def relative_bias(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """The gathered bias ``(heads, n, n)``; cached while the table cannot receive grads.

        ``n`` smaller than the full window (a window clamped to a small input) uses the leading
        ``n x n`` block of the index, as mmaction2's video Swin does.
        """
        table = self.relative_position_bias_table
        needs_grad = table.requires_grad and torch.is_grad_enabled()
        key = (n, table.device, dtype, table._version, table.data_ptr())
        if not needs_grad and self._bias_cache is not None and self._bias_cache[0] == key:
            return self._bias_cache[1]
        index = self.relative_position_index[:n, :n].reshape(-1)
        bias = table[index].view(n, n, -1)
        bias = bias.permute(2, 0, 1).contiguous().to(dtype)
        if not needs_grad:
            self._bias_cache = (key, bias.detach())
        else:
            self._bias_cache = None
        return bias

    @staticmethod
    def window_bias(bias: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Relative bias ``(heads, N, N)`` plus shift mask ``(nW, N, N)`` -> ``(nW, heads, N, N)``."""
        return bias.unsqueeze(0) + mask.to(bias.dtype).unsqueeze(1)

    def masked_bias(self, bias: torch.Tensor, mask: torch.Tensor, batch: int) -> torch.Tensor:
        """:meth:`window_bias` laid out per window as ``(batch * nW, heads, N, N)``, cached.

        SDPA's fused CPU kernel needs a 4-D mask whose leading dim matches the windows; the
        mask varies per window, so it is materialised over the batch. Only used without grads;
        the result is cached (one entry, keyed by the identity of the mask from the bounded
        ``shift_window_mask`` cache, the bias tensor and the batch), so inference pays for it once.
        """
        cached = self._masked_cache
        if cached is not None and cached[0] is mask and cached[1] is bias and cached[2] == batch:
            return cached[3]
        nw, n = mask.shape[0], mask.shape[-1]
        combined = self.window_bias(bias, mask).unsqueeze(0).expand(batch, -1, -1, -1, -1)
        combined = combined.reshape(batch * nw, self.num_heads, n, n)
        self._masked_cache = (mask, bias, batch, combined)
        return combined

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B * nW, N, C) windows; mask: (nW, N, N) shift mask or None -> (B * nW, N, C)."""
        bw, n, _ = x.shape
        # q, k, v stay strided views of the projection output: the fused kernel reads them as is.
        q, k, v = self.qkv_heads(x)
        bias = self.relative_bias(n, q.dtype)
        if mask is None:
            # 4-D: a 3-D bias would send SDPA to its math path instead of the fused kernel.
            out = self.attend(q, k, v, bias.unsqueeze(0))
        elif self.use_sdpa and not bias.requires_grad:
            out = self.attend(q, k, v, self.masked_bias(bias, mask, bw // mask.shape[0]))
        else:
            # Explicit path (see attend): split the windows off the batch so the per-window
            # bias broadcasts without being materialised per image.
            fold = (bw // mask.shape[0], mask.shape[0], self.num_heads, n, self.head_dim)
            out = self.attend(q.view(fold), k.view(fold), v.view(fold),
                              self.window_bias(bias, mask)).view(bw, self.num_heads, n,
                                                                 self.head_dim)
        return self.out_proj(out)

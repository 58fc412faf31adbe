"""Feed-forward block and stochastic depth shared by the transformer backbones."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..compat import custom_bwd, custom_fwd
from .linear import Linear, linear, linear_grads, mlp_inference
from .switch import fast_path_active


class DropPath(nn.Module):
    """Stochastic depth: zero a whole sample's residual branch with probability ``drop_prob``."""

    def __init__(self, drop_prob: float = 0.):
        super().__init__()
        self.drop_prob = float(drop_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0. or not self.training:
            return x
        keep = 1. - self.drop_prob
        shape = (x.shape[0], ) + (1, ) * (x.ndim - 1)
        return x * x.new_empty(shape).bernoulli_(keep).div_(keep)

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob}'


class _GeluLinear(torch.autograd.Function):
    """``F.linear(gelu(h), weight, bias)`` that saves ``h`` only and recomputes the GELU in
    backward (the fast path of :class:`FFN`, taken only where ``switch.fast_path_active``).

    The GELU output (as large as ``h``) is otherwise kept alive for the second linear's weight
    gradient; recomputing it costs one elementwise pass and saves a quarter of a transformer
    block's activation memory. ``custom_fwd``/``custom_bwd`` keep the backward in the forward's
    dtype should autocast ever be active around it.
    """

    @staticmethod
    @custom_fwd('cpu')
    def forward(ctx, h, weight, bias):
        ctx.save_for_backward(h, weight)
        ctx.has_bias = bias is not None
        return linear(F.gelu(h), weight, bias)

    @staticmethod
    @custom_bwd('cpu')
    def backward(ctx, grad_out):
        h, weight = ctx.saved_tensors
        with torch.enable_grad():
            h_leaf = h.detach().requires_grad_()
            g = F.gelu(h_leaf)
        grad_g, grad_w, grad_b = linear_grads(grad_out, g.detach(), weight,
                                              bias_grad=ctx.has_bias)
        grad_h, = torch.autograd.grad(g, h_leaf, grad_g)
        return grad_h, grad_w, grad_b


class FFN(nn.Module):
    """Two-layer MLP with GELU; the module layout (``layers.0.0`` / ``layers.1``) is the one of
    mmcv's ``FFN``, so mmdet/mmseg checkpoints load without renaming. Returns the branch only;
    callers add the residual (with their DropPath)."""

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.,
                 act_layer=nn.GELU):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(Linear(embed_dims, hidden_dims), act_layer(), nn.Dropout(drop)),
            Linear(hidden_dims, embed_dims), nn.Dropout(drop))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc1, act, drop1 = self.layers[0]
        fc2, drop2 = self.layers[1], self.layers[2]
        if not (self.training and (drop1.p > 0 or drop2.p > 0)):
            out = mlp_inference(x, fc1, act, fc2)
            if out is not None:
                return out
        recompute_gelu = (type(act) is nn.GELU and act.approximate == 'none'
                          and not (self.training and drop1.p > 0) and torch.is_grad_enabled()
                          and fast_path_active(x, fc1.weight))
        if not recompute_gelu:
            return self.layers(x)
        return drop2(_GeluLinear.apply(fc1(x), fc2.weight, fc2.bias))


def drop_path_schedule(drop_path_rate: float, depths) -> list:
    """Linearly increasing stochastic-depth rates, split per stage: ``[[r, ...], ...]``."""
    total = sum(depths)
    rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)] if total else []
    out, start = [], 0
    for d in depths:
        out.append(rates[start:start + d])
        start += d
    return out

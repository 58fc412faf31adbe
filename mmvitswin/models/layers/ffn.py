"""Feed-forward block and stochastic depth shared by the transformer backbones."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .linear import linear, weight_and_bias_grads


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
    """``linear(gelu(h), weight, bias)`` that saves ``h`` only and recomputes the GELU in backward.

    The GELU output (as large as ``h``) is otherwise kept alive for the second linear's weight
    gradient; recomputing it costs one elementwise pass and saves a quarter of a transformer
    block's activation memory.
    """

    @staticmethod
    def forward(ctx, h, weight, bias):
        ctx.save_for_backward(h, weight)
        ctx.has_bias = bias is not None
        return linear(F.gelu(h), weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        h, weight = ctx.saved_tensors
        g = F.gelu(h)
        grad_g = linear(grad_out, weight.t().contiguous())
        grad_w, grad_b = weight_and_bias_grads(grad_out, g, ctx.has_bias)
        grad_h = torch.ops.aten.gelu_backward(grad_g, h)
        return grad_h, grad_w, grad_b


class FFN(nn.Module):
    """Two-layer MLP with GELU; the module layout (``layers.0.0`` / ``layers.1``) is the one of
    mmcv's ``FFN``, so mmdet/mmseg checkpoints load without renaming. Returns the branch only;
    callers add the residual (with their DropPath)."""

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.,
                 act_layer=nn.GELU):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(nn.Linear(embed_dims, hidden_dims), act_layer(), nn.Dropout(drop)),
            nn.Linear(hidden_dims, embed_dims), nn.Dropout(drop))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc1, act, drop1 = self.layers[0]
        fc2, drop2 = self.layers[1], self.layers[2]
        exact_gelu = type(act) is nn.GELU and act.approximate == 'none'
        if not exact_gelu or (self.training and drop1.p > 0):
            return self.layers(x)
        if torch.is_grad_enabled():
            return drop2(_GeluLinear.apply(linear(x, fc1.weight, fc1.bias), fc2.weight,
                                                fc2.bias))
        return linear(linear(x, fc1.weight, fc1.bias, 'gelu'), fc2.weight, fc2.bias)


def drop_path_schedule(drop_path_rate: float, depths) -> list:
    """Linearly increasing stochastic-depth rates, split per stage: ``[[r, ...], ...]``."""
    total = sum(depths)
    rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)] if total else []
    out, start = [], 0
    for d in depths:
        out.append(rates[start:start + d])
        start += d
    return out

"""Feed-forward block and stochastic depth shared by the transformer backbones."""
import torch
import torch.nn as nn


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
        return self.layers(x)


def drop_path_schedule(drop_path_rate: float, depths) -> list:
    """Linearly increasing stochastic-depth rates, split per stage: ``[[r, ...], ...]``."""
    total = sum(depths)
    rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)] if total else []
    out, start = [], 0
    for d in depths:
        out.append(rates[start:start + d])
        start += d
    return out

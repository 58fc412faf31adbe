"""LayerScale (CaiT, DeiT-III, DINOv2): a learned per-channel scale on a residual branch."""
import torch
import torch.nn as nn


class LayerScale(nn.Module):
    """``x * gamma`` with ``gamma: (dim, )`` initialised to ``init_values``.

    The parameter is ``gamma`` (timm's and Meta's DINOv2 name: ``blocks.N.ls1.gamma``), so
    those checkpoints load without renaming. ``x: (..., dim)`` -> same shape.
    """

    def __init__(self, dim: int, init_values: float = 1e-5):
        super().__init__()
        self.init_values = float(init_values)
        self.gamma = nn.Parameter(torch.full((dim, ), self.init_values))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.gamma, self.init_values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma

    def extra_repr(self) -> str:
        return f'dim={self.gamma.shape[0]}, init_values={self.init_values}'

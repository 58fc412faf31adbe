"""SwiGLU feed-forward (Shazeer 2020), as DINOv2-g and DINOv3 H+ use it."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def swiglu_hidden_dims(embed_dims: int, mlp_ratio: float = 4.0) -> int:
    """DINOv2's hidden width of a SwiGLU FFN for a ``mlp_ratio`` MLP: two thirds of
    ``mlp_ratio * embed_dims`` rounded up to a multiple of 8 (4096 for ViT-g, 1536 x 4)."""
    hidden = int(embed_dims * mlp_ratio)
    return (int(hidden * 2 / 3) + 7) // 8 * 8


class SwiGLUFFN(nn.Module):
    """``w3(silu(a) * b)`` with ``a, b = w12(x).chunk(2)``; returns the branch only.

    Keys ``w12`` (``(2 * hidden, C)``: the gate half first, then the value half) and ``w3``
    (``(C, hidden)``) are Meta's DINOv2 names (``SwiGLUFFNFused``); timm's packed
    ``mlp.fc1/fc2`` and HF's ``weights_in/weights_out`` hold the same tensors.
    ``x: (..., C)`` -> same shape.
    """

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.):
        super().__init__()
        self.hidden_dims = hidden_dims
        self.w12 = nn.Linear(embed_dims, 2 * hidden_dims)
        self.w3 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.w12(x).chunk(2, dim=-1)
        return self.drop(self.w3(self.drop(F.silu(gate) * value)))

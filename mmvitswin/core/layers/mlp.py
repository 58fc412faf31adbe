"""Two-layer MLP under the timm / mmaction2 names ``fc1`` / ``fc2``.

Checkpoints of the video Swin (mmaction2, the Video Swin release) name the block MLP
``mlp.fc1`` / ``mlp.fc2``, where mmcv's layout (:class:`~.ffn.FFN`) is ``layers.0.0`` /
``layers.1``: the same computation under the names those checkpoints carry.
"""
import torch
import torch.nn as nn

__all__ = ['FcNamedFFN']


class FcNamedFFN(nn.Module):
    """``drop(fc2(drop1(act(fc1(x)))))``; returns the branch only."""

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.,
                 act_layer=nn.GELU):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop1(self.act(self.fc1(x)))))

"""SAM's image-encoder neck: the trunk's last map to ``out_channels`` (256) channels.

``1x1 conv -> LayerNorm2d -> 3x3 conv (padding 1) -> LayerNorm2d``, convolutions without bias
(a norm follows each), LayerNorm2d with eps 1e-6, as Meta's ``segment_anything`` ``ImageEncoderViT``
``neck`` (and HF's ``SamVisionNeck``, timm's ``VisionTransformerSAM.neck``). A ``nn.Sequential``
so its parameter names are Meta's and timm's (``neck.0.weight``, ``neck.1.{weight,bias}``,
``neck.2.weight``, ``neck.3.{weight,bias}``).
"""
import torch
import torch.nn as nn

from ..validate import check_positive_int
from .norm import LayerNorm2d

__all__ = ['SamNeck']


class SamNeck(nn.Sequential):
    """``forward(x: (B, in_channels, h, w)) -> (B, out_channels, h, w)``."""

    def __init__(self, in_channels: int, out_channels: int = 256, eps: float = 1e-6):
        check_positive_int('in_channels', in_channels)
        check_positive_int('out_channels', out_channels)
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 1, bias=False),
            LayerNorm2d(out_channels, eps),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            LayerNorm2d(out_channels, eps),
        )
        self.in_channels = in_channels
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # contiguous NCHW out: LayerNorm2d's permutes leave channels-last strides
        return super().forward(x).contiguous()

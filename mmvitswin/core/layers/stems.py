"""Convolutional stem layers: weight-standardised convolution and TF-'SAME' padding.

Used by the hybrid ResNetV2 front end (:mod:`mmvitswin.core.backbones.hybrid_vit`) and
available to any new CNN stem. ``padding='same'`` pads like TensorFlow: the output has
``ceil(size / stride)`` cells and an odd total padding puts the extra cell after
(bottom/right), which is what the ported Google hybrid weights were trained with.
"""
from typing import Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..compat import is_tracing
from .window import ceil_div, to_tuple

IntPair = Union[int, Tuple[int, int]]

__all__ = ['standardize_weight', 'same_padding', 'pad_same', 'StdConv2d', 'MaxPool2dSame']


def standardize_weight(weight: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Weight standardisation: zero mean, unit (biased) variance per output channel.

    weight: (out, in / groups, kh, kw) -> same shape; differentiable (the gradient flows
    through the mean and the variance, as in training with weight standardisation).
    """
    flat = weight.reshape(weight.shape[0], -1)
    var, mean = torch.var_mean(flat, dim=1, correction=0, keepdim=True)
    return ((flat - mean) * torch.rsqrt(var + eps)).reshape_as(weight)


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> Tuple[int, int]:
    """TensorFlow 'SAME' padding ``(before, after)`` for one axis.

    The output has ``ceil(size / stride)`` cells; when the total padding is odd the extra cell
    goes *after* (bottom/right). That asymmetry is what the ported Google hybrid weights were
    trained with; a symmetric PyTorch padding would move the sampling grid off theirs.
    """
    span = (kernel - 1) * dilation + 1
    if span == 1:  # a 1x1 window at any stride: ceil(size / stride) cells need no padding
        return 0, 0
    # (ceil(size / stride) - 1) * stride lies in [size - stride, size - 1], so the total below
    # is >= span - stride: never negative when the window spans the stride (every stem conv
    # and pool), and then no max() is needed, which keeps a traced size's expression plain
    # (a symbolic max nested through the stem slows compile and export by minutes)
    total = (ceil_div(size, stride) - 1) * stride + span - size
    if span < stride:  # torch.sym_max: no branch on the size while tracing
        total = torch.sym_max(total, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel: Tuple[int, int], stride: Tuple[int, int],
             dilation: Tuple[int, int] = (1, 1), value: float = 0.) -> torch.Tensor:
    """Pad ``x: (B, C, H, W)`` for a TF 'SAME' window op (see :func:`same_padding`)."""
    top, bottom = same_padding(x.shape[-2], kernel[0], stride[0], dilation[0])
    left, right = same_padding(x.shape[-1], kernel[1], stride[1], dilation[1])
    if is_tracing() or top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


class StdConv2d(nn.Conv2d):
    """``nn.Conv2d`` whose kernel is standardised (:func:`standardize_weight`) on every call.

    ``padding='same'``: TensorFlow 'SAME' padding computed from the input size (asymmetric when
    needed); a static symmetric padding is used when it is exactly equivalent (stride 1, odd
    effective kernel). An int/tuple ``padding`` behaves as in ``nn.Conv2d``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntPair,
                 stride: IntPair = 1, padding: Union[str, IntPair] = 'same',
                 dilation: IntPair = 1, groups: int = 1, bias: bool = False,
                 eps: float = 1e-8):
        kernel_t = to_tuple(kernel_size, 2, 'kernel_size')
        stride_t = to_tuple(stride, 2, 'stride')
        dilation_t = to_tuple(dilation, 2, 'dilation')
        if isinstance(padding, str):
            if padding.lower() != 'same':
                raise ValueError(f"padding must be 'same' or an int/tuple, got {padding!r}")
            static = all(s == 1 and (d * (k - 1)) % 2 == 0
                         for k, s, d in zip(kernel_t, stride_t, dilation_t))
            padding = tuple(d * (k - 1) // 2 for k, d in zip(kernel_t, dilation_t)) \
                if static else 0
            dynamic = not static
        else:
            dynamic = False
        if eps <= 0:
            raise ValueError(f'eps must be positive, got {eps}')
        super().__init__(in_channels, out_channels, kernel_t, stride=stride_t, padding=padding,
                         dilation=dilation_t, groups=groups, bias=bias)
        self.dynamic_same = dynamic
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dynamic_same:
            x = pad_same(x, self.kernel_size, self.stride, self.dilation)
        return F.conv2d(x, standardize_weight(self.weight, self.eps), self.bias, self.stride,
                        self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        same = ', padding=same(dynamic)' if self.dynamic_same else ''
        return super().extra_repr() + same + f', eps={self.eps}'


class MaxPool2dSame(nn.MaxPool2d):
    """Max pooling with TF 'SAME' padding (pads with -inf, so padding never wins the max)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, s = to_tuple(self.kernel_size, 2, 'kernel_size'), to_tuple(self.stride, 2, 'stride')
        x = pad_same(x, k, s, value=float('-inf'))
        return F.max_pool2d(x, k, s, 0, self.dilation, self.ceil_mode)

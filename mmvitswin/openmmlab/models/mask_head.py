"""An mmdet mask head that runs its convolutions in channels-last memory."""
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from mmcv.cnn.bricks import wrappers as mmcv_wrappers
from mmdet.models.roi_heads.mask_heads import FCNMaskHead
from torch import Tensor, nn

from ..registry import MODELS


def _is_subpixel(layer: nn.Module) -> bool:
    """Whether ``layer`` is a transposed conv whose square kernel equals its stride (no
    padding, dilation or groups): each input pixel then writes its own ``s x s`` block.

    Torch's class or mmcv's wrapper of it (mmdet's ``'deconv'``, which only adds an
    empty-input case); a subclass with a forward of its own is left to that forward."""
    own_forward = type(layer).forward not in (nn.ConvTranspose2d.forward,
                                              mmcv_wrappers.ConvTranspose2d.forward)
    return (isinstance(layer, nn.ConvTranspose2d) and not own_forward
            and layer.kernel_size == layer.stride
            and layer.stride[0] == layer.stride[1] and layer.padding == (0, 0)
            and layer.output_padding == (0, 0) and layer.dilation == (1, 1)
            and layer.groups == 1)


def subpixel_upsample(layer: nn.ConvTranspose2d, x: Tensor,
                      activation: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    """``activation(layer(x))`` for a transposed conv with kernel == stride == ``(s, s)`` (see
    :func:`_is_subpixel`), computed as a 1x1 conv to ``s * s * C_out`` channels, the
    activation, and one copy that moves each pixel's ``s x s`` block into place.

    Same values and gradients (the weight is only re-indexed; an element-wise activation
    commutes with moving pixels). On the CPU it replaces oneDNN's transposed-conv backward,
    the slowest kernel of mmdet's mask head under bf16, by matrix products. For a
    channels-last ``x`` the copy moves runs of ``C_out`` contiguous values and the result is
    channels-last.
    """
    s = layer.stride[0]
    n, _, h, w = x.shape
    c_out = layer.out_channels
    # (C_in, C_out, s, s) -> (s * s * C_out, C_in, 1, 1): channel (i * s + j) * C_out + c is
    # output channel c at offset (i, j) of the pixel's block.
    weight = layer.weight.permute(2, 3, 1, 0).reshape(-1, layer.in_channels, 1, 1)
    bias = None if layer.bias is None else layer.bias.repeat(s * s)
    y = F.conv2d(x, weight, bias)
    if activation is not None:
        y = activation(y)
    # (n, h, w, i, j, c) -> (n, h, i, w, j, c), which is the (n, h * s, w * s, c) map
    y = y.permute(0, 2, 3, 1).reshape(n, h, w, s, s, c_out).permute(0, 1, 3, 2, 4, 5)
    return y.reshape(n, h * s, w * s, c_out).permute(0, 3, 1, 2)


@MODELS.register_module()
class ChannelsLastFCNMaskHead(FCNMaskHead):
    """mmdet's ``FCNMaskHead`` computed in channels-last (NHWC) memory, with its 2x2
    transposed conv run as a 1x1 conv plus a pixel move (:func:`subpixel_upsample`).

    Same constructor, parameters, checkpoint keys and outputs (values and gradients) as
    ``FCNMaskHead``; only the memory layout of the activations differs, so the returned mask
    logits are a channels-last tensor. On a CPU oneDNN runs these convolutions in NHWC without
    the layout reorders it inserts for NCHW, and the transposed conv's backward (the slowest
    kernel of the head in bf16) becomes two matrix products: under bf16 autocast on a CPU it
    makes a Mask R-CNN iteration about a quarter shorter::

        mask_head=dict(type='ChannelsLastFCNMaskHead', num_convs=4, in_channels=256,
                       conv_out_channels=256, num_classes=80,
                       loss_mask=dict(type='CrossEntropyLoss', use_mask=True,
                                      loss_weight=1.0))
    """

    def forward(self, x: Tensor) -> Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        for conv in self.convs:
            x = conv(x)
        if self.upsample is not None:
            activation = self.relu if self.upsample_method == 'deconv' else None
            if _is_subpixel(self.upsample):
                x = subpixel_upsample(self.upsample, x, activation)
            else:
                x = self.upsample(x)
                if activation is not None:
                    x = activation(x)
        return self.conv_logits(x)

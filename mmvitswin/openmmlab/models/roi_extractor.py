"""An mmdet RoI extractor whose RoI layers may be mmvitswin's plain-PyTorch ops."""
from typing import List, Optional, Tuple

from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
from torch import Tensor, nn

from ...core import ops as mmvitswin_ops
from ..registry import MODELS


@MODELS.register_module()
class SeparableRoIExtractor(SingleRoIExtractor):
    """mmdet's ``SingleRoIExtractor`` (FPN level by RoI scale, one RoI layer per level) whose
    ``roi_layer`` ``type`` is looked up in :mod:`mmvitswin.core.ops` first, then in ``mmcv.ops``.

    Its default layer is ``SeparableRoIAlign``: mmcv's ``RoIAlign`` values (``pool_mode='avg'``)
    without mmcv's slow CPU backward; it made mmdet's Mask R-CNN Swin-T iteration with ``--amp``
    1.5x faster on a 2-core CPU::

        bbox_roi_extractor=dict(
            type='SeparableRoIExtractor',
            roi_layer=dict(type='SeparableRoIAlign', output_size=7, sampling_ratio=0),
            out_channels=256, featmap_strides=[4, 8, 16, 32])

    With ``SeparableRoIAlign`` layers the boxes are not cast to the features' dtype. mmdet
    casts them for mmcv's kernels; under bf16 autocast that rounds a coordinate to 8
    significant bits (to a multiple of 4 pixels between 512 and 1024), so the pooled windows
    drift from the boxes. ``SeparableRoIAlign`` pools in fp32 and takes the boxes as given.

    Checkpoints are interchangeable with ``SingleRoIExtractor`` (RoIAlign has no weights).
    """

    def __init__(self, roi_layer: dict = dict(type='SeparableRoIAlign', output_size=7,
                                              sampling_ratio=0), **kwargs):
        super().__init__(roi_layer=roi_layer, **kwargs)

    def build_roi_layers(self, layer_cfg: dict, featmap_strides: List[int]) -> nn.ModuleList:
        cfg = dict(layer_cfg)
        layer_type = cfg.get('type')
        layer_cls = getattr(mmvitswin_ops, layer_type, None) if isinstance(layer_type, str) \
            else None
        if isinstance(layer_cls, type) and issubclass(layer_cls, nn.Module):
            cfg['type'] = layer_cls
        return super().build_roi_layers(cfg, featmap_strides)

    def forward(self, feats: Tuple[Tensor], rois: Tensor,
                roi_scale_factor: Optional[float] = None) -> Tensor:
        layers = self.roi_layers[:len(feats)]
        if not all(isinstance(layer, mmvitswin_ops.SeparableRoIAlign) for layer in layers):
            return super().forward(feats, rois, roi_scale_factor)
        if len(feats) == 1:  # as mmdet: one level pools every box, without roi_scale_factor
            return layers[0](feats[0], rois)
        levels = self.map_roi_levels(rois, len(feats))
        if roi_scale_factor is not None:
            rois = self.roi_rescale(rois, roi_scale_factor)
        out = feats[0].new_zeros((rois.shape[0], self.out_channels, *layers[0].output_size))
        for level, layer in enumerate(layers):
            index = (levels == level).nonzero().squeeze(1)
            if index.numel():
                out[index] = layer(feats[level], rois[index])
            else:
                # A level without boxes still joins the graph with a zero gradient, as in mmdet:
                # distributed training expects every feature map to receive one.
                out = out + feats[level].sum() * 0.
        return out

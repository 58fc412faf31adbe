"""An mmdet RoI extractor whose RoI layers may be mmvitswin's plain-PyTorch ops."""
from typing import List

from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
from torch import nn

from .. import ops as mmvitswin_ops
from ..registry import MODELS


@MODELS.register_module()
class SeparableRoIExtractor(SingleRoIExtractor):
    """mmdet's ``SingleRoIExtractor`` (FPN level by RoI scale, one RoI layer per level) whose
    ``roi_layer`` ``type`` is looked up in :mod:`mmvitswin.ops` first, then in ``mmcv.ops``.

    Its default layer is ``SeparableRoIAlign``: mmcv's ``RoIAlign`` values (``pool_mode='avg'``)
    without mmcv's slow CPU backward; it made mmdet's Mask R-CNN Swin-T iteration with ``--amp``
    1.5x faster on a 2-core CPU (``docs/benchmarks.md``)::

        bbox_roi_extractor=dict(
            type='SeparableRoIExtractor',
            roi_layer=dict(type='SeparableRoIAlign', output_size=7, sampling_ratio=0),
            out_channels=256, featmap_strides=[4, 8, 16, 32])

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

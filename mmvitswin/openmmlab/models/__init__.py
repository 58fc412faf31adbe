"""Registered models: the core backbones (thin OpenMMLab classes) and the CPU detection heads."""
from .backbones import (HybridViT, SwinTransformer, SwinTransformer3D, SwinTransformerV2,
                        ViTAdapter)
from .mask_head import ChannelsLastFCNMaskHead
from .roi_extractor import SeparableRoIExtractor

__all__ = ['SwinTransformer', 'SwinTransformer3D', 'ViTAdapter', 'HybridViT',
           'ChannelsLastFCNMaskHead', 'SeparableRoIExtractor', 'SwinTransformerV2']

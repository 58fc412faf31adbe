"""The backbones as plain ``nn.Module`` s (torch only)."""
from .base import TransformerBackbone
from .hybrid_vit import HybridViT
from .swin import SwinTransformer
from .swin3d import SwinTransformer3D
from .swin_v2 import SwinTransformerV2
from .vit import ViTAdapter, VisionTransformerTrunk

__all__ = ['TransformerBackbone', 'SwinTransformer', 'SwinTransformer3D', 'ViTAdapter',
           'VisionTransformerTrunk', 'HybridViT', 'SwinTransformerV2']

from .swin import SwinTransformer
from .vit import ViTAdapter, VisionTransformerTrunk

__all__ = ['SwinTransformer', 'ViTAdapter', 'VisionTransformerTrunk']
from .swin3d import SwinTransformer3D  # noqa: E402
__all__ += ['SwinTransformer3D']
from .hybrid_vit import HybridViT  # noqa: E402
__all__ += ['HybridViT']

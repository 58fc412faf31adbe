"""mmvitswin's core: layers, backbones and checkpoint families that need only torch.

Importing it changes no global state (no registration, no patching). The backbones are plain
``nn.Module`` s that return feature pyramids (NCHW, strides 4/8/16/32) for any input size::

    from mmvitswin.core import SwinTransformer
    model = SwinTransformer(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint='swin_t.pth'))
    model.init_weights()
    feats = model(images)

The OpenMMLab layer (:mod:`mmvitswin.openmmlab`, imported by ``import mmvitswin`` when
MMEngine is installed) registers them for MMDetection / MMSegmentation configs.
"""
from .backbones import (HybridViT, SwinTransformer, SwinTransformer3D, SwinTransformerV2,
                        TransformerBackbone, ViTAdapter, VisionTransformerTrunk)
from .checkpoint import (CheckpointError, fit_checkpoint, load_checkpoint_file,
                         load_pretrained)

# Every backbone class the OpenMMLab layer registers, by registry name.
BACKBONES = {cls.__name__: cls for cls in (SwinTransformer, SwinTransformer3D, ViTAdapter,
                                            HybridViT, SwinTransformerV2)}

__all__ = ['BACKBONES', 'TransformerBackbone', 'SwinTransformer', 'SwinTransformer3D',
           'ViTAdapter', 'VisionTransformerTrunk', 'HybridViT', 'CheckpointError',
           'fit_checkpoint', 'load_checkpoint_file', 'load_pretrained', 'SwinTransformerV2']

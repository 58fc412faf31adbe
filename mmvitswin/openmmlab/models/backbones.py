"""The core backbones as registered OpenMMLab modules.

Each registered class is its core class (same constructor, keys, numbers) plus what MMEngine
expects of a backbone on top of plain PyTorch: every ``init_cfg`` type MMEngine knows
(``Pretrained`` stays ours: format detection and fitting; ``Kaiming``, ``Constant``, lists of
them... go to ``mmengine.model.initialize``) and ``Pretrained`` checkpoints behind MMEngine's
other schemes (``open-mmlab://``, ``s3://``, ...), read by MMEngine's ``CheckpointLoader``.
"""
from mmengine.model import initialize
from mmengine.runner import CheckpointLoader

from ...core import backbones as core
from ...core.checkpoint import load_pretrained_dict
from ..registry import MODELS

_CORE_SCHEMES = ('http://', 'https://')


class OpenMMLabBackbone:
    """Mixin in front of a core backbone: MMEngine's ``init_cfg`` types and file schemes."""

    def init_weights(self) -> None:
        cfg = self.init_cfg
        if cfg is None:
            return super().init_weights()
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            checkpoint = cfg['checkpoint']
            if (isinstance(checkpoint, str) and '://' in checkpoint
                    and not checkpoint.startswith(_CORE_SCHEMES)):
                ckpt = CheckpointLoader.load_checkpoint(checkpoint, map_location='cpu')
                load_pretrained_dict(self, ckpt, source=checkpoint, prefix=cfg.get('prefix'))
                self.is_init = True
                return
            return super().init_weights()
        self._init_random()  # MMEngine's initialisers then override what they name
        initialize(self, cfg)
        self.is_init = True


def _registered(core_cls: type) -> type:
    cls = type(core_cls.__name__, (OpenMMLabBackbone, core_cls), {
        '__module__': __name__,
        '__doc__': core_cls.__doc__,
    })
    MODELS.register_module(module=cls)
    return cls


SwinTransformer = _registered(core.SwinTransformer)
SwinTransformer3D = _registered(core.SwinTransformer3D)
ViTAdapter = _registered(core.ViTAdapter)
HybridViT = _registered(core.HybridViT)
SwinTransformerV2 = _registered(core.SwinTransformerV2)

__all__ = ['OpenMMLabBackbone', 'SwinTransformer', 'SwinTransformer3D', 'ViTAdapter',
           'HybridViT', 'SwinTransformerV2']

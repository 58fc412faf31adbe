"""Life-cycle shared by every backbone: random init, Pretrained loading, frozen parts.

Plain PyTorch: the OpenMMLab layer (:mod:`mmvitswin.openmmlab.models`) registers these classes
and adds MMEngine's other ``init_cfg`` types on top.
"""
import warnings
from typing import Iterable, List, Optional, Tuple

import torch.nn as nn

from ..checkpoint.loading import fit_checkpoint, load_pretrained
from ..validate import ArgumentTypeError, ArgumentValueError


def init_linear_and_norm(modules: Iterable[nn.Module]) -> None:
    """Truncated-normal (std 0.02) Linear weights with zero bias and unit LayerNorms: the
    default init of the mmdet/mmseg/mmaction2 transformers and of timm's ViT."""
    for m in modules:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):  # norm_cfg may drop its weight or bias
            if m.weight is not None:
                nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def pretrained_to_init_cfg(pretrained: Optional[str], init_cfg: Optional[dict]):
    """The deprecated ``pretrained=PATH`` argument of OpenMMLab backbones as an ``init_cfg``."""
    if pretrained is None:
        return init_cfg
    if init_cfg is not None:
        raise ArgumentValueError('init_cfg and pretrained cannot be set at the same time')
    if not isinstance(pretrained, str):
        raise ArgumentTypeError(f'pretrained must be a str (path or URL) or None, got '
                        f'{type(pretrained).__name__}')
    warnings.warn('pretrained is deprecated, use init_cfg=dict(type="Pretrained", '
                  'checkpoint=...) instead', DeprecationWarning)
    return dict(type='Pretrained', checkpoint=pretrained)


class TransformerBackbone(nn.Module):
    """Base of our backbones (a plain ``nn.Module``).

    - ``init_weights()``: ``init_cfg=dict(type='Pretrained', checkpoint=...)`` goes through
      :func:`mmvitswin.core.checkpoint.load_pretrained` (any file, sharded index or
      HuggingFace snapshot directory; format auto-detection by the subclass's
      ``checkpoint_family()``, run by ``convert_checkpoint``, with the snapshot's
      ``config.json`` when it has one); no ``init_cfg``
      re-runs the subclass's ``_init_random``. Other ``init_cfg`` types are MMEngine's
      initialisers: the registered classes of :mod:`mmvitswin.openmmlab` run them.
    - ``train(mode)`` returns ``self`` and keeps what ``frozen_modules()`` /
      ``frozen_parameters()`` name frozen: no grad, and modules stay in eval mode.

    The backbone protocol every subclass answers (used by the optimizer constructors and
    the pyramid builders, no ``isinstance``): ``out_strides`` / ``out_channels`` (one entry
    per returned map), ``size_divisibility`` (what the input is padded to internally; 1 for
    none), ``num_layers_for_decay`` and ``get_layer_depth(param_name)``.
    """

    def __init__(self, init_cfg: Optional[dict] = None):
        super().__init__()
        self.init_cfg = init_cfg
        self._is_init = False

    @property
    def is_init(self) -> bool:
        return self._is_init

    @is_init.setter
    def is_init(self, value: bool) -> None:
        self._is_init = value

    def _init_random(self) -> None:
        init_linear_and_norm(self.modules())

    def checkpoint_family(self):
        """The :class:`~mmvitswin.core.checkpoint.loading.CheckpointFamily` describing this
        backbone's checkpoints (None: ``Pretrained`` loads keys as they are)."""
        return None

    def convert_checkpoint(self, state_dict, config: Optional[dict] = None):
        """Any state dict of this backbone's family -> its keys and sizes (used by init_cfg,
        tools/convert_checkpoint.py): the family run by the one engine. ``config``: the
        checkpoint's parsed HuggingFace ``config.json`` (checked against this model), if any."""
        family = self.checkpoint_family()
        if family is None:
            return state_dict
        return fit_checkpoint(family, state_dict, self, config=config)

    def init_weights(self) -> None:
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            load_pretrained(self, cfg['checkpoint'], prefix=cfg.get('prefix'))
        elif cfg is None:
            self._init_random()
        else:
            raise ValueError(f'{type(self).__name__}: init_cfg of type {cfg.get("type") if isinstance(cfg, dict) else type(cfg).__name__!r} '
                             'needs MMEngine\'s initialisers: build the registered class '
                             '(mmvitswin.openmmlab) or use init_cfg=None / '
                             'dict(type="Pretrained", checkpoint=...)')
        self._is_init = True

    def frozen_modules(self) -> List[nn.Module]:
        return []

    def frozen_parameters(self) -> List[nn.Parameter]:
        """Parameters frozen on their own (position embeddings, tokens)."""
        return []

    def _freeze_stages(self) -> None:
        for p in self.frozen_parameters():
            p.requires_grad = False
        for m in self.frozen_modules():
            m.eval()
            for p in m.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        return self

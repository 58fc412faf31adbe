"""Layer-wise learning-rate decay (BEiT / ViTDet / ViT-Adapter fine-tuning recipe).

Every parameter gets a *depth*: 0 for the embedding (patch embedding, position embedding, CLS
token), ``i + 1`` for transformer block ``i``, ``num_layers + 1`` for everything after the trunk
(final norm, adapters, necks, heads). Its learning rate is
``base_lr * layer_decay_rate ** (num_layers + 1 - depth)``, so the head trains at ``base_lr`` and
earlier blocks progressively slower.

The backbone decides the depths (the backbone protocol of :mod:`mmvitswin.core.backbones`,
no ``isinstance`` here): ``get_layer_depth(name)`` and ``num_layers_for_decay`` (the ViTs:
their blocks; Swin: every block of every stage, the patch merging of a stage with its last
block). A backbone without ``num_layers_for_decay`` gives its ``num_layers``.

Weight decay follows BEiT/ViTDet: none for 1-D parameters (norm weights, biases) and for
position embeddings, CLS tokens and relative-position tables (``no_weight_decay_names``
extends that list).

Registered as ``LayerDecayOptimWrapperConstructor`` (not ``LayerDecayOptimizerConstructor``:
mmseg already owns that name for BEiT/ConvNeXt, and the registry bridge would replace it in
mmseg configs).
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor

from ..registry import OPTIM_WRAPPER_CONSTRUCTORS
from ...core.validate import check_positive_int, check_positive_number

NO_DECAY_NAMES = ('pos_embed', 'cls_token', 'absolute_pos_embed', 'relative_position_bias_table',
                  'rel_pos_h', 'rel_pos_w')
_PARAMWISE_KEYS = {'num_layers', 'layer_decay_rate', 'no_weight_decay_names'}


# ------------------------------------------------------------------------ pure functions
def layer_lr_scale(depth: int, num_layers: int, rate: float) -> float:
    """``rate ** (num_layers + 1 - depth)``."""
    return rate**(num_layers + 1 - depth)


def uses_weight_decay(name: str, param: nn.Parameter, no_decay_names: Sequence[str]) -> bool:
    """False for 1-D parameters and the embeddings/tables listed in ``no_decay_names``."""
    if param.ndim <= 1 or name.endswith('.bias'):
        return False
    last = name.rsplit('.', 1)[-1]
    return last not in no_decay_names


def find_backbone(model: nn.Module) -> Tuple[str, Optional[nn.Module]]:
    """``('backbone.', model.backbone)`` for detectors/segmentors, ``('', model)`` for a bare
    backbone that knows its depths, else ``('', None)``."""
    backbone = getattr(model, 'backbone', None)
    if isinstance(backbone, nn.Module):
        return 'backbone.', backbone
    if _depth_rule(model) is not None:
        return '', model
    return '', None


def _depth_rule(backbone: nn.Module) -> Optional[Tuple[Callable[[str], int], int]]:
    """(name -> depth, num_layers) from a backbone that answers ``get_layer_depth``, else
    None."""
    if not callable(getattr(backbone, 'get_layer_depth', None)):
        return None
    num_layers = getattr(backbone, 'num_layers_for_decay', None)
    if num_layers is None:
        num_layers = backbone.num_layers
    return backbone.get_layer_depth, int(num_layers)


# ------------------------------------------------------------------------- constructor
@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Optimizer-wrapper constructor with layer-wise lr decay for ViT and Swin backbones.

    ``paramwise_cfg``: ``layer_decay_rate`` (required, in (0, 1]), ``num_layers`` (optional;
    must equal the backbone's block count when given), ``no_weight_decay_names`` (extra
    parameter names without weight decay). Parameters with ``requires_grad=False`` are left
    out, as mmengine's default constructor does. One param group per (depth, decay) pair; each
    group records ``layer_depth`` and ``lr_scale``.

    Config::

        optim_wrapper = dict(
            type='OptimWrapper', constructor='LayerDecayOptimWrapperConstructor',
            optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05),
            paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.65))
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None):
        super().__init__(optim_wrapper_cfg, None)
        cfg = dict(paramwise_cfg or {})
        unknown = set(cfg) - _PARAMWISE_KEYS
        if unknown:
            raise ValueError(f'paramwise_cfg has unsupported keys {sorted(unknown)}; expected '
                             f'{sorted(_PARAMWISE_KEYS)}')
        if 'layer_decay_rate' not in cfg:
            raise ValueError('paramwise_cfg.layer_decay_rate must be set: a number in (0, 1]')
        rate = check_positive_number('paramwise_cfg.layer_decay_rate', cfg['layer_decay_rate'],
                                     high=1)
        num_layers = cfg.get('num_layers')
        if num_layers is not None:
            check_positive_int('paramwise_cfg.num_layers', num_layers)
        extra_names = cfg.get('no_weight_decay_names', ())
        if isinstance(extra_names, str) or not isinstance(extra_names, (list, tuple)) or \
                not all(isinstance(n, str) for n in extra_names):
            raise TypeError(f'paramwise_cfg.no_weight_decay_names must be a list of parameter '
                            f'names (str), got {extra_names!r}')
        if self.base_lr is None:
            raise ValueError('optimizer.lr must be set for layer-wise lr decay')
        self.layer_decay_rate = float(rate)
        self.num_layers = num_layers
        self.no_decay_names = NO_DECAY_NAMES + tuple(cfg.get('no_weight_decay_names', ()))
        self.paramwise_cfg = cfg  # non-empty: mmengine then calls add_params

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        prefix, backbone = find_backbone(module)
        rule = _depth_rule(backbone) if backbone is not None else None
        if rule is None:
            raise TypeError(f'layer-wise lr decay needs a ViT or Swin backbone from mmvitswin '
                            f'(one with get_layer_depth); got '
                            f'{type(backbone if backbone is not None else module).__name__}')
        depth_of, num_layers = rule
        if self.num_layers is not None and self.num_layers != num_layers:
            raise ValueError(f'paramwise_cfg.num_layers={self.num_layers}, but the backbone '
                             f'{type(backbone).__name__} has {num_layers} blocks')
        base_wd = self.base_wd or 0.
        groups: Dict[Tuple[int, bool], dict] = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            if prefix and not name.startswith(prefix):
                depth = num_layers + 1
            else:
                depth = depth_of(name[len(prefix):])
            decay = uses_weight_decay(name, param, self.no_decay_names)
            key = (depth, decay)
            if key not in groups:
                scale = layer_lr_scale(depth, num_layers, self.layer_decay_rate)
                groups[key] = dict(params=[], param_names=[], lr=self.base_lr * scale,
                                   weight_decay=base_wd if decay else 0., lr_scale=scale,
                                   layer_depth=depth)
            groups[key]['params'].append(param)
            groups[key]['param_names'].append(name)
        for key in sorted(groups):
            params.append(groups[key])
        print_log(f'layer decay: {len(groups)} param groups, depths 0..{num_layers + 1}, lr '
                  f'{self.base_lr * layer_lr_scale(0, num_layers, self.layer_decay_rate):.3g} '
                  f'(embedding) .. {self.base_lr:.3g} (after the trunk)', logger='current')

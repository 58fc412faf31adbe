"""Normalisation and activation layers built from OpenMMLab config dicts.

One home for every norm the backbones and adapters use: ``build_layer_norm`` (transformer
blocks), ``LayerNorm2d`` (channels of an NCHW map: the simple pyramid), ``build_batch_norm``
(the interaction adapter's convolutional branch and outputs), ``group_norm`` (the hybrid's
ResNetV2 front end) and ``build_act`` (activation factories from ``act_cfg``).
"""
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..validate import (ArgumentTypeError, ArgumentValueError, check_bool, check_choice,
                        check_number, check_positive_number)

__all__ = ['LayerNorm2d', 'build_act', 'build_layer_norm', 'build_batch_norm', 'group_norm']

_BATCH_NORMS = {'BN': nn.BatchNorm2d, 'BN2d': nn.BatchNorm2d, 'SyncBN': nn.SyncBatchNorm}


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of an NCHW map (ViTDet/ConvNeXt ``LayerNorm2d``)."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), x.shape[1:2], self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class Clamp(nn.Module):
    """``torch.clamp(x, min, max)``: mmcv's ``Clamp`` (also registered as ``Clip``)."""

    def __init__(self, min: float = -1., max: float = 1.):
        super().__init__()
        self.min, self.max = min, max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=self.min, max=self.max)


class HSigmoid(nn.Module):
    """``clamp((x + bias) / divisor, min_value, max_value)``: mmcv's ``HSigmoid`` (its
    defaults are ``nn.Hardsigmoid``'s numbers)."""

    def __init__(self, bias: float = 3., divisor: float = 6., min_value: float = 0.,
                 max_value: float = 1.):
        super().__init__()
        self.bias, self.divisor = bias, divisor
        self.min_value, self.max_value = min_value, max_value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x + self.bias) / self.divisor).clamp(self.min_value, self.max_value)


def _one_parameter(name: str, value) -> int:
    # mmcv's FFN applies the activation to (B, L, C) tokens, and PReLU's per-channel weights
    # to dim 1, the token axis: only one shared slope means the same thing in our
    # channels-last (B, H, W, C) blocks (the reference fails unless L == num_parameters).
    if value != 1 or isinstance(value, bool):
        raise ArgumentValueError(f'{name} must be 1 (one slope shared by all channels): '
                                 f'PReLU in a transformer FFN weighs dim 1, the token axis; '
                                 f'got {value!r}')
    return 1


def _divisor(name: str, value) -> float:
    value = check_number(name, value)
    if value == 0:  # mmcv asserts it
        raise ArgumentValueError(f'{name} must not be 0')
    return value


def _gelu_approximate(name: str, value) -> str:
    return check_choice(name, value, ('none', 'tanh'))


# mmcv 2.1's activation registry (mmcv/cnn/bricks/{activation,hswish,hsigmoid,swish}.py):
# type -> (module, {keyword: check}); the keywords are those of the module's constructor.
# mmcv's own Swish takes no arguments; it computes x * sigmoid(x), which is nn.SiLU.
_ActSpec = Tuple[Callable[..., nn.Module], Dict[str, Callable]]
_ACTS: Dict[str, _ActSpec] = {
    'ReLU': (nn.ReLU, dict(inplace=check_bool)),
    'LeakyReLU': (nn.LeakyReLU, dict(negative_slope=check_number, inplace=check_bool)),
    'PReLU': (nn.PReLU, dict(num_parameters=_one_parameter, init=check_number)),
    'RReLU': (nn.RReLU, dict(lower=check_number, upper=check_number, inplace=check_bool)),
    'ReLU6': (nn.ReLU6, dict(inplace=check_bool)),
    'ELU': (nn.ELU, dict(alpha=check_number, inplace=check_bool)),
    'Sigmoid': (nn.Sigmoid, {}),
    'Tanh': (nn.Tanh, {}),
    'SiLU': (nn.SiLU, dict(inplace=check_bool)),
    'Swish': (nn.SiLU, {}),
    'GELU': (nn.GELU, dict(approximate=_gelu_approximate)),
    'HSwish': (nn.Hardswish, dict(inplace=check_bool)),
    'HSigmoid': (HSigmoid, dict(bias=check_number, divisor=_divisor, min_value=check_number,
                                max_value=check_number)),
    'Clamp': (Clamp, dict(min=check_number, max=check_number)),
    'Clip': (Clamp, dict(min=check_number, max=check_number)),
}
# mmcv's registry also builds from the class itself (``type=nn.GELU``)
_ACT_CLASSES = {nn.ReLU: 'ReLU', nn.LeakyReLU: 'LeakyReLU', nn.PReLU: 'PReLU', nn.RReLU: 'RReLU',
                nn.ReLU6: 'ReLU6', nn.ELU: 'ELU', nn.Sigmoid: 'Sigmoid', nn.Tanh: 'Tanh',
                nn.SiLU: 'SiLU', nn.GELU: 'GELU', nn.Hardswish: 'HSwish'}


def _cfg_type(name: str, cfg) -> object:
    if not isinstance(cfg, dict):
        raise ArgumentTypeError(f"{name} must be a dict with a 'type' key, got "
                                f'{type(cfg).__name__} {cfg!r}')
    if 'type' not in cfg:
        raise ArgumentValueError(f"{name} must have a 'type' key, got {cfg!r}")
    return cfg['type']


def build_act(act_cfg: Optional[dict]) -> Callable[[], nn.Module]:
    """Activation factory (zero-arg callable returning a new module) from an OpenMMLab
    ``act_cfg``: the types of mmcv's activation registry with their keyword arguments and the
    same modules (``HSwish`` is ``nn.Hardswish``, ``Swish`` ``nn.SiLU``; mmcv's ``Clamp`` /
    ``Clip`` and ``HSigmoid`` are re-implemented here), or one of those torch classes as
    ``type``. ``None`` -> GELU. Anything else raises an
    :class:`~mmvitswin.core.validate.ArgumentError` naming ``act_cfg``."""
    if act_cfg is None:
        return nn.GELU
    kind = _cfg_type('act_cfg', act_cfg)
    if isinstance(kind, type) and kind in _ACT_CLASSES:
        kind = _ACT_CLASSES[kind]
    if not isinstance(kind, str) or kind not in _ACTS:
        raise ArgumentValueError(f'act_cfg type must be one of {", ".join(_ACTS)} (or one of '
                                 f'those torch classes), got {kind!r}')
    factory, checks = _ACTS[kind]
    kwargs = {}
    for key, value in act_cfg.items():
        if key == 'type':
            continue
        if key not in checks:
            allowed = ', '.join(checks) or 'none'
            raise ArgumentTypeError(f'act_cfg: {kind} takes no argument {key!r} (its '
                                    f'arguments: {allowed}), got {act_cfg!r}')
        kwargs[key] = checks[key](f'act_cfg.{key}', value)
    return lambda: factory(**kwargs)


def _set_requires_grad(norm: nn.Module, requires_grad: bool) -> nn.Module:
    for p in norm.parameters():
        p.requires_grad = requires_grad
    return norm


def _norm_kwargs(norm_cfg: dict, kind: str, checks: Dict[str, Callable]) -> dict:
    """The checked keyword arguments of a norm ``norm_cfg`` (``type`` and ``requires_grad``
    excluded); a keyword the module does not take -> ArgumentTypeError (mmcv: TypeError)."""
    kwargs = {}
    for key, value in norm_cfg.items():
        if key in ('type', 'requires_grad'):
            continue
        if key not in checks:
            raise ArgumentTypeError(f'norm_cfg: {kind} takes no argument {key!r} (its '
                                    f'arguments: {", ".join(checks)}, requires_grad), got '
                                    f'{norm_cfg!r}')
        kwargs[key] = checks[key](f'norm_cfg.{key}', value)
    return kwargs


_LAYER_NORM_ARGS = dict(eps=check_positive_number, elementwise_affine=check_bool,
                        bias=check_bool)


def build_layer_norm(norm_cfg: Optional[dict], dims: int) -> nn.LayerNorm:
    """LayerNorm from an OpenMMLab ``norm_cfg``, as mmcv's ``build_norm_layer`` builds it:
    ``type='LN'`` (or ``'LayerNorm'``, ``nn.LayerNorm``), optional ``eps``,
    ``elementwise_affine``, ``bias`` (``nn.LayerNorm``'s keywords) and ``requires_grad``.
    The transformer backbones support LayerNorm only: another type, or another keyword,
    raises an :class:`~mmvitswin.core.validate.ArgumentError` naming ``norm_cfg``."""
    cfg = dict(type='LN') if norm_cfg is None else norm_cfg
    kind = _cfg_type('norm_cfg', cfg)
    if kind not in ('LN', 'LayerNorm', nn.LayerNorm):
        raise ArgumentValueError(f"norm_cfg type must be 'LN' (LayerNorm: the transformer "
                                 f'blocks normalise each token), got {kind!r}')
    requires_grad = check_bool('norm_cfg.requires_grad', cfg.get('requires_grad', True))
    kwargs = _norm_kwargs(cfg, 'LN', _LAYER_NORM_ARGS)
    kwargs.setdefault('eps', 1e-5)  # mmcv's default for every norm (torch's too)
    return _set_requires_grad(nn.LayerNorm(dims, **kwargs), requires_grad)


def _momentum(name: str, value) -> Optional[float]:
    # None: BatchNorm's cumulative moving average
    return None if value is None else check_positive_number(name, value, high=1.)


_BATCH_NORM_ARGS = dict(eps=check_positive_number, momentum=_momentum)


def build_batch_norm(norm_cfg: Optional[dict], channels: int) -> nn.Module:
    """BatchNorm from an OpenMMLab ``norm_cfg``: ``type`` 'BN'/'BN2d' (default) or 'SyncBN';
    optional ``eps``, ``momentum``, ``requires_grad`` (mmcv's keywords ``affine`` and
    ``track_running_stats`` are refused: the layers built on this keep both). Another type or
    keyword raises an :class:`~mmvitswin.core.validate.ArgumentError` naming ``norm_cfg``.
    (mmengine's runner turns SyncBN back into BN when training is not distributed.)"""
    cfg = dict(type='BN') if norm_cfg is None else norm_cfg
    kind = _cfg_type('norm_cfg', cfg)
    if kind not in _BATCH_NORMS:
        raise ArgumentValueError(f'norm_cfg type must be one of {sorted(_BATCH_NORMS)}, got '
                                 f'{kind!r}')
    requires_grad = check_bool('norm_cfg.requires_grad', cfg.get('requires_grad', True))
    kwargs = _norm_kwargs(cfg, kind, _BATCH_NORM_ARGS)
    return _set_requires_grad(_BATCH_NORMS[kind](channels, **kwargs), requires_grad)


def group_norm(channels: int, num_groups: int = 32, eps: float = 1e-5) -> nn.GroupNorm:
    """GroupNorm(32) as everywhere in the hybrid's front end (eps 1e-5, timm's GroupNormAct
    default)."""
    if channels % num_groups:
        raise ValueError(f'GroupNorm with {num_groups} groups needs channels divisible by '
                         f'{num_groups}, got {channels}')
    return nn.GroupNorm(num_groups, channels, eps=eps)

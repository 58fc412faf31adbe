"""Normalisation and activation layers built from OpenMMLab config dicts.

One home for every norm the backbones and adapters use: ``build_layer_norm`` (transformer
blocks), ``LayerNorm2d`` (channels of an NCHW map: the simple pyramid), ``build_batch_norm``
(the interaction adapter's convolutional branch and outputs), ``group_norm`` (the hybrid's
ResNetV2 front end) and ``build_act`` (activation factories from ``act_cfg``).
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..validate import check_bool, check_positive_number

__all__ = ['LayerNorm2d', 'build_act', 'build_layer_norm', 'build_batch_norm', 'group_norm']

_ACTS = {'GELU': nn.GELU, 'ReLU': nn.ReLU, 'SiLU': nn.SiLU, 'Swish': nn.SiLU}
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


def build_act(act_cfg: Optional[dict]):
    """Activation class (a zero-arg factory) from an OpenMMLab ``act_cfg`` dict."""
    if act_cfg is None:
        return nn.GELU
    if not isinstance(act_cfg, dict) or 'type' not in act_cfg:
        raise TypeError(f"act_cfg must be a dict with a 'type' key, got {act_cfg!r}")
    name = act_cfg['type']
    if name not in _ACTS:
        raise ValueError(f'act_cfg type must be one of {sorted(_ACTS)}, got {name!r}')
    kwargs = {k: v for k, v in act_cfg.items() if k != 'type'}
    return lambda: _ACTS[name](**kwargs)


def _set_requires_grad(norm: nn.Module, requires_grad: bool) -> nn.Module:
    for p in norm.parameters():
        p.requires_grad = requires_grad
    return norm


def build_layer_norm(norm_cfg: Optional[dict], dims: int) -> nn.LayerNorm:
    """LayerNorm from an OpenMMLab ``norm_cfg`` (``type='LN'``, optional ``eps``,
    ``requires_grad``); the transformer backbones support LayerNorm only."""
    cfg = dict(type='LN') if norm_cfg is None else dict(norm_cfg)
    if cfg.pop('type', None) not in ('LN', 'LayerNorm'):
        raise ValueError(f"norm_cfg type must be 'LN', got {norm_cfg!r}")
    requires_grad = check_bool('norm_cfg.requires_grad', cfg.pop('requires_grad', True))
    norm = nn.LayerNorm(dims, eps=check_positive_number('norm_cfg.eps', cfg.pop('eps', 1e-5)))
    if cfg:
        raise ValueError(f'norm_cfg has unsupported keys {sorted(cfg)}')
    return _set_requires_grad(norm, requires_grad)


def build_batch_norm(norm_cfg: Optional[dict], channels: int) -> nn.Module:
    """BatchNorm from an OpenMMLab ``norm_cfg``: ``type`` 'BN' (default) or 'SyncBN'; optional
    ``eps``, ``momentum``, ``requires_grad``. (mmengine's runner turns SyncBN back into BN when
    training is not distributed.)"""
    cfg = dict(type='BN') if norm_cfg is None else dict(norm_cfg)
    kind = cfg.pop('type', None)
    if kind not in _BATCH_NORMS:
        raise ValueError(f'norm_cfg type must be one of {sorted(_BATCH_NORMS)}, got {norm_cfg!r}')
    requires_grad = cfg.pop('requires_grad', True)
    kwargs = {k: cfg.pop(k) for k in ('eps', 'momentum') if k in cfg}
    if cfg:
        raise ValueError(f'norm_cfg has unsupported keys {sorted(cfg)}')
    return _set_requires_grad(_BATCH_NORMS[kind](channels, **kwargs), requires_grad)


def group_norm(channels: int, num_groups: int = 32, eps: float = 1e-5) -> nn.GroupNorm:
    """GroupNorm(32) as everywhere in the hybrid's front end (eps 1e-5, timm's GroupNormAct
    default)."""
    if channels % num_groups:
        raise ValueError(f'GroupNorm with {num_groups} groups needs channels divisible by '
                         f'{num_groups}, got {channels}')
    return nn.GroupNorm(num_groups, channels, eps=eps)

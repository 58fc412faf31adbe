"""Small helpers shared by the backbones: config-driven layers and input checks."""
from typing import Optional

import torch
import torch.nn as nn

_ACTS = {'GELU': nn.GELU, 'ReLU': nn.ReLU, 'SiLU': nn.SiLU, 'Swish': nn.SiLU}


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


def build_layer_norm(norm_cfg: Optional[dict], dims: int) -> nn.LayerNorm:
    """LayerNorm from an OpenMMLab ``norm_cfg`` (``type='LN'``, optional ``eps``,
    ``requires_grad``); the transformer backbones support LayerNorm only."""
    cfg = dict(type='LN') if norm_cfg is None else dict(norm_cfg)
    if cfg.pop('type', None) not in ('LN', 'LayerNorm'):
        raise ValueError(f"norm_cfg type must be 'LN', got {norm_cfg!r}")
    requires_grad = cfg.pop('requires_grad', True)
    norm = nn.LayerNorm(dims, eps=cfg.pop('eps', 1e-5))
    if cfg:
        raise ValueError(f'norm_cfg has unsupported keys {sorted(cfg)}')
    for p in norm.parameters():
        p.requires_grad = requires_grad
    return norm


def check_image_input(x, in_channels: int, ndim: int = 4, name: str = 'x') -> None:
    """Validate a backbone input at the boundary: a floating tensor of shape
    (B, in_channels, *spatial) with ``ndim`` dims and non-empty spatial dims."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'{name} must be a torch.Tensor, got {type(x).__name__}')
    layout = '(B, C, H, W)' if ndim == 4 else '(B, C, T, H, W)'
    if x.dim() != ndim:
        raise ValueError(f'{name} must be {ndim}-D {layout}, got shape {tuple(x.shape)}')
    if not x.is_floating_point():
        raise TypeError(f'{name} must be a floating-point tensor, got dtype {x.dtype}')
    if x.shape[1] != in_channels:
        raise ValueError(f'{name} must have in_channels={in_channels} channels (dim 1), got '
                         f'shape {tuple(x.shape)}')
    if min(x.shape[2:]) < 1 or x.shape[0] < 1:
        raise ValueError(f'{name} must have non-empty batch and spatial dims, got '
                         f'{tuple(x.shape)}')

"""Small helpers shared by the backbones: config-driven layers and input checks.

The argument validators (``check_positive_int`` & co.) live in :mod:`mmvitswin.validate`
and are re-exported here."""
from typing import Optional

import torch
import torch.nn as nn

from ..compat import is_autocast_enabled
from ..validate import (check_bool, check_choice, check_index, check_int,  # noqa: F401
                        check_int_sequence, check_non_negative_int, check_optional_dict,
                        check_optional_str, check_positive_int, check_positive_number,
                        check_probability, int_tuple)

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
    requires_grad = check_bool('norm_cfg.requires_grad', cfg.pop('requires_grad', True))
    norm = nn.LayerNorm(dims, eps=check_positive_number('norm_cfg.eps', cfg.pop('eps', 1e-5)))
    if cfg:
        raise ValueError(f'norm_cfg has unsupported keys {sorted(cfg)}')
    for p in norm.parameters():
        p.requires_grad = requires_grad
    return norm


def autocast_active(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type`` ('cpu', 'cuda', ...) here."""
    return bool(is_autocast_enabled(device_type))  # every torch version: mmvitswin.compat


def param_dtype(module: nn.Module) -> Optional[torch.dtype]:
    """dtype of the first floating-point parameter of ``module`` (None if it has none)."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def check_image_input(x, in_channels: int, ndim: int = 4, name: str = 'x',
                      model: Optional[nn.Module] = None) -> None:
    """Validate a backbone input at the boundary.

    ``x`` must be a floating-point tensor of shape ``(B, in_channels, *spatial)`` with ``ndim``
    dims and non-empty batch and spatial dims. Any memory layout (channels-last, strided views)
    is accepted; values are not inspected (NaN pixels propagate).

    dtype policy (``model`` given): the input dtype must equal the dtype of the model's
    parameters -- a float64 image into a float32 model is refused with a TypeError naming both
    dtypes instead of failing deep inside a convolution -- unless ``torch.autocast`` is active
    on the input's device, where mixed dtypes are the point (autocast casts per op); float64,
    which autocast leaves alone, must match the parameters even then.
    """
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
    if model is not None:
        expected = param_dtype(model)
        # autocast casts every floating input except float64 to its compute dtype per op
        if expected is not None and x.dtype != expected and not (
                x.dtype != torch.float64 and autocast_active(x.device.type)):
            raise TypeError(
                f'{name} has dtype {x.dtype} but the parameters of {type(model).__name__} are '
                f'{expected}: convert the input (x.to({expected})) or the model '
                f'(model.to({x.dtype})), or run under torch.autocast')

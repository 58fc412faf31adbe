"""Small helpers shared by the backbones: input checks, dtype probes, building parameters on
another device.

The config-driven layers (``build_act``, ``build_layer_norm``) live in
:mod:`mmvitswin.core.layers.norm`, the argument validators (``check_positive_int`` & co.) and
their error classes (``ArgumentError`` & co.) in :mod:`mmvitswin.core.validate`; both are
re-exported here."""
import contextlib
from typing import Iterator, Optional

import torch
import torch.nn as nn

from .compat import is_autocast_enabled
from .layers.norm import build_act, build_layer_norm  # noqa: F401  (their home: layers/norm.py)
from .validate import (ArgumentError, ArgumentIndexError, ArgumentTypeError,  # noqa: F401
                        ArgumentValueError, check_args, check_bool, check_choice, check_dict,
                        check_index, check_int, check_int_sequence, check_non_negative_int,
                        check_optional_dict, check_optional_str, check_positive_int,
                        check_positive_number, check_probability, int_tuple)


def autocast_active(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type`` ('cpu', 'cuda', ...) here."""
    return bool(is_autocast_enabled(device_type))  # every torch version: mmvitswin.core.compat


def param_dtype(module: nn.Module) -> Optional[torch.dtype]:
    """dtype of the first floating-point parameter of ``module`` (None if it has none)."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


@contextlib.contextmanager
def parameters_on(device: Optional[str]) -> Iterator[None]:
    """Every parameter registered inside goes to ``device``; buffers stay where they are made.
    ``'meta'`` builds modules without memory for their weights (each is allocated where its
    module creates it and moved at once): a sharding strategy then gives each process its
    shard and fills it from a checkpoint. None: nothing changes."""
    if device is None:
        yield
        return

    def move(module, name, param):
        if param is None or param.device == torch.device(device):
            return None
        return nn.Parameter(param.detach().to(device), requires_grad=param.requires_grad)

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(move)
    try:
        yield
    finally:
        handle.remove()


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

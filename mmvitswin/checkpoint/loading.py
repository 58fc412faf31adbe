"""Reading checkpoint files, unwrapping their containers, and loading into a backbone.

Format-specific key conversion lives beside this file (``swin.py``, ...): pure functions from a
state dict to a state dict in our layout. This module does the generic part: find the state dict
inside whatever container was saved, hand it to the backbone's converter, resize what the
backbone knows how to resize, refuse an architecture mismatch, and report every key that still
does not match in **one** warning.
"""
import warnings
from collections import OrderedDict
from typing import Dict, List, NamedTuple, Optional

import torch
import torch.nn as nn

StateDict = Dict[str, torch.Tensor]
_CONTAINER_KEYS = ('state_dict', 'model', 'module', 'model_state', 'state_dict_ema')


class LoadReport(NamedTuple):
    missing: List[str]
    unexpected: List[str]


def load_checkpoint_file(checkpoint: str, map_location='cpu') -> dict:
    """Load a checkpoint from a path or URL (anything mmengine's CheckpointLoader accepts)."""
    if not isinstance(checkpoint, str):
        raise TypeError(f'checkpoint must be a path or URL string, got {type(checkpoint).__name__}')
    from mmengine.runner import CheckpointLoader
    return CheckpointLoader.load_checkpoint(checkpoint, map_location=map_location)


def unwrap_state_dict(ckpt, prefix: Optional[str] = None) -> StateDict:
    """Find the tensors of a model inside a saved object.

    Accepts a bare state dict or one wrapped in ``state_dict``/``model``/``module``/...; strips
    ``module.`` (DataParallel/DDP); keeps only the ``prefix`` sub-tree when given, else the
    ``backbone.`` sub-tree when the file is a whole detector/segmentor.
    """
    if not isinstance(ckpt, dict):
        raise TypeError(f'checkpoint must hold a dict, got {type(ckpt).__name__}')
    sd = ckpt
    while isinstance(sd, dict) and not _has_tensors(sd):
        inner = next((sd[k] for k in _CONTAINER_KEYS if isinstance(sd.get(k), dict)), None)
        if inner is None:
            raise ValueError(f'no state dict found in checkpoint (top-level keys: '
                             f'{sorted(sd)[:10]})')
        sd = inner
    sd = OrderedDict((k, v) for k, v in sd.items() if isinstance(v, torch.Tensor))
    if sd and all(k.startswith('module.') for k in sd):
        sd = OrderedDict((k[len('module.'):], v) for k, v in sd.items())
    if prefix is None and any(k.startswith('backbone.') for k in sd):
        prefix = 'backbone.'
    if prefix:
        if not prefix.endswith('.'):
            prefix += '.'
        sd = OrderedDict((k[len(prefix):], v) for k, v in sd.items() if k.startswith(prefix))
        if not sd:
            raise ValueError(f'checkpoint has no keys under prefix {prefix!r}')
    return sd


def _has_tensors(d: dict) -> bool:
    return any(isinstance(v, torch.Tensor) for v in d.values())


def load_state_dict_reported(model: nn.Module, state_dict: StateDict,
                             source: str = 'checkpoint') -> LoadReport:
    """Load a converted state dict; refuse shape mismatches; warn once about leftover keys.

    Derived buffers that the model rebuilds itself (``relative_position_index``) never count
    as missing.
    """
    own = model.state_dict()
    state_dict = OrderedDict(state_dict)
    for k in own:  # derived buffers are rebuilt by the model, never taken from a file
        if k.endswith('relative_position_index'):
            state_dict[k] = own[k]
    bad = [f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}'
           for k, v in state_dict.items() if k in own and own[k].shape != v.shape]
    if bad:
        raise ValueError(f'{source} does not fit {type(model).__name__} (different architecture?)'
                         ': ' + '; '.join(bad[:8]) + (f' (+{len(bad) - 8} more)' if len(bad) > 8
                                                     else ''))
    result = model.load_state_dict(state_dict, strict=False)
    report = LoadReport(list(result.missing_keys), list(result.unexpected_keys))
    if report.missing or report.unexpected:
        parts = []
        if report.missing:
            parts.append(f'missing in {source} (left as initialised): {", ".join(report.missing)}')
        if report.unexpected:
            parts.append(f'unused from {source}: {", ".join(report.unexpected)}')
        warnings.warn(f'{type(model).__name__}: ' + ' | '.join(parts), stacklevel=2)
    return report


def load_pretrained(model: nn.Module, checkpoint: str, prefix: Optional[str] = None,
                    map_location='cpu') -> LoadReport:
    """Load ``checkpoint`` into ``model`` through its ``convert_checkpoint(state_dict)``.

    The backbone's converter detects the format, renames keys to our layout and resizes
    position tables to the model; this function does the rest (see module docstring).
    """
    ckpt = load_checkpoint_file(checkpoint, map_location=map_location)
    sd = unwrap_state_dict(ckpt, prefix=prefix)
    convert = getattr(model, 'convert_checkpoint', None)
    if convert is not None:
        sd = convert(sd)
    return load_state_dict_reported(model, sd, source=str(checkpoint))

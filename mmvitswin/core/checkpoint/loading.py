"""Reading checkpoint files, unwrapping their containers, and loading into a backbone.

Each checkpoint family is described as data beside this file (``swin.py``, ``swin3d.py``,
``vit.py``, ``hybrid_vit.py``: a :class:`CheckpointFamily` each). This module is the one engine
that runs them (:func:`fit_checkpoint`: detect, convert, drop derived keys, probe the
architecture from the keys and the file's ``config.json``, refuse keys of features the model
lacks, resize, fit) and does the generic part: find the state dict inside whatever
container was saved, hand it to the backbone's ``convert_checkpoint``, refuse shape mismatches
and report every key that still does not match in **one** warning.
"""
import re
import warnings
from collections import OrderedDict
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn

from .files import Checkpoint, CheckpointError, read_checkpoint

StateDict = Dict[str, torch.Tensor]
_CONTAINER_KEYS = ('state_dict', 'model', 'module', 'model_state', 'state_dict_ema')
# Tensors a model derives from its config (window gather indices, shift masks, log-spaced
# coordinate tables): rebuilt by the model, never taken from a file.
DERIVED_KEYS = ('relative_position_index', 'attn_mask', 'relative_coords_table')


class LoadReport(NamedTuple):
    missing: List[str]
    unexpected: List[str]


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


# ------------------------------------------------------------------- checkpoint families
class CheckpointFamily(NamedTuple):
    """What one model family's checkpoints look like, as data (see each family's module:
    ``checkpoint/swin.py``, ``swin3d.py``, ``vit.py``, ``hybrid_vit.py``); run by
    :func:`fit_checkpoint`.

    - ``name``: how errors name the family ('Swin', 'ViT', ...).
    - ``convert(sd) -> (sd, format)``: detect the layout (ValueError when it is none of the
      family's) and rename keys / transform tensors to ours. With ``convert_needs_config=True``
      it is called as ``convert(sd, config)`` instead, ``config`` being the checkpoint's parsed
      ``config.json`` (a dict) or None when the file came without one.
    - ``transform(sd, format, model) -> sd``: the conversions that need the model's config
      (video inflation of image weights); None: none.
    - ``probe(sd) -> {field: value}``: the architecture the converted keys reveal (None:
      unknown); ``model_probe(model)`` the same fields of the model. A difference is refused.
    - ``config_probe(config) -> {field: value}``: the architecture a HuggingFace
      ``config.json`` reveals (None: unknown; the function itself None: the family reads no
      config), compared with ``model_probe(model)`` exactly like ``probe`` (so
      ``model_probe`` must answer every field it returns). Return ``{}`` for a config of
      another model type that says nothing about this family's fields.
    - ``resize``: ``(key regex, fn(key, value, own, model) -> tensor)`` rules applied to each
      key whose shape differs from the model's tensor ``own`` (position tables, kernels).
    - ``fit(sd, model) -> sd``: the family's whole-dict fitting (None: none), after ``resize``.
    - ``derived``: key suffixes the model rebuilds itself (``relative_position_index``): never
      taken from a file, always the model's own values.
    - ``keep_initialised``: ``{format: key regex}``: model keys a file of that format cannot
      hold (new heads); they keep their initialisation without being reported missing.
    - ``drop_mismatched``: key regex of tensors left initialised (reported missing) when their
      shape does not fit, instead of refusing the file.
    - ``unrepresentable``: ``(key regex, feature)`` or ``(key regex, feature, how)`` entries:
      a converted key matching the regex (``re.search``) that the model's state dict lacks
      means the file needs a feature this model was built without (a LayerScale gamma, an
      absolute position embedding): refused with ``checkpoint has <key> (<feature>), which
      this model does not have: build it with <how>`` (``how`` defaults to ``feature``), not
      left to the leftover-keys warning with wrong features.
    """
    name: str
    convert: Callable[..., Tuple[StateDict, str]]
    probe: Callable[[StateDict], Dict[str, object]]
    model_probe: Callable[[nn.Module], Dict[str, object]]
    resize: Tuple[Tuple[str, Callable], ...] = ()
    transform: Optional[Callable[[StateDict, str, nn.Module], StateDict]] = None
    fit: Optional[Callable[[StateDict, nn.Module], StateDict]] = None
    derived: Tuple[str, ...] = DERIVED_KEYS
    keep_initialised: Dict[str, str] = {}
    drop_mismatched: Optional[str] = None
    config_probe: Optional[Callable[[dict], Dict[str, object]]] = None
    convert_needs_config: bool = False
    unrepresentable: Tuple[Tuple[str, ...], ...] = ()


def _check_fields(family: CheckpointFamily, have: Dict[str, object],
                  want: Dict[str, object], what: str) -> None:
    for field, value in have.items():  # (None on either side: not known there)
        if value is not None and want[field] is not None and value != want[field]:
            raise ValueError(f'{what} is a {family.name} with {field}={value}, but this '
                             f'model has {field}={want[field]}')


def check_unrepresentable(family: CheckpointFamily, sd: StateDict, own: StateDict) -> None:
    """ValueError for the first ``family.unrepresentable`` entry that a key of ``sd`` (the
    converted file) matches while the model (``own``: its state dict) has no such key."""
    for entry in family.unrepresentable:
        pattern, feature = entry[0], entry[1]
        how = entry[2] if len(entry) > 2 else feature
        keys = [k for k in sd if k not in own and re.search(pattern, k)]
        if keys:
            more = f' and {len(keys) - 1} more like it' if len(keys) > 1 else ''
            raise ValueError(f'checkpoint has {keys[0]}{more} ({feature}), which this model '
                             f'does not have: build it with {how}')


def fit_checkpoint(family: CheckpointFamily, sd: StateDict, model: nn.Module,
                   config: Optional[dict] = None) -> StateDict:
    """Any state dict of ``family`` -> ``model``'s keys and sizes: detect, convert, drop
    derived keys, check the architecture (keys, then ``config``: the checkpoint's parsed
    ``config.json`` when it came with one), refuse keys of features the model lacks
    (``family.unrepresentable``), resize, fit, then the model's own derived tensors.
    ValueError (naming the field or key) when the file belongs to another architecture."""
    sd, fmt = family.convert(sd, config) if family.convert_needs_config else family.convert(sd)
    if family.transform is not None:
        sd = family.transform(sd, fmt, model)
    sd = OrderedDict((k, v) for k, v in sd.items() if not k.endswith(family.derived))
    want = family.model_probe(model)
    _check_fields(family, family.probe(sd), want, 'checkpoint')
    if config is not None and family.config_probe is not None:
        _check_fields(family, family.config_probe(config), want, 'checkpoint (its config.json)')
    own = model.state_dict()
    check_unrepresentable(family, sd, own)
    for key, value in list(sd.items()):
        if key not in own or own[key].shape == value.shape:
            continue
        if family.drop_mismatched and re.fullmatch(family.drop_mismatched, key):
            del sd[key]
            continue
        for pattern, resize in family.resize:
            if re.search(pattern, key):
                sd[key] = resize(key, value, own[key], model)
                break
    if family.fit is not None:
        sd = family.fit(sd, model)
    for key, value in own.items():
        if key.endswith(family.derived):
            sd[key] = value
    keep = family.keep_initialised.get(fmt)
    if keep:
        for key, value in own.items():
            if re.match(keep, key):
                sd.setdefault(key, value)
    return sd


def _is_sharded(tensor) -> bool:
    """A DTensor (a sharded model's parameter, e.g. under FSDP2)."""
    return hasattr(tensor, 'to_local') and hasattr(tensor, 'placements')


def _local_shard(full: torch.Tensor, target) -> torch.Tensor:
    """This process's piece of ``full`` for the DTensor ``target`` (FSDP2's layout: dim-0
    chunks over a 1-D mesh, the last ones empty when dim 0 is short); only that piece of a
    memory-mapped ``full`` is read."""
    mesh, (placement, ) = target.device_mesh, target.placements
    if mesh.ndim != 1 or not placement.is_shard(0):
        raise ValueError(f'loading into a tensor sharded as {target.placements} over a '
                         f'{mesh.ndim}-D mesh is not supported (FSDP2 shards dim 0 on a 1-D mesh)')
    rank, pieces = mesh.get_local_rank(), torch.chunk(full, mesh.size(), dim=0)
    return pieces[rank] if rank < len(pieces) else full[:0]


def _load(model: nn.Module, own: StateDict, state_dict: StateDict) -> LoadReport:
    """``model.load_state_dict(state_dict, strict=False)``; into a sharded model (DTensor
    parameters) each process copies its own piece of every tensor."""
    if not any(_is_sharded(t) for t in own.values()):
        result = model.load_state_dict(state_dict, strict=False)
        return LoadReport(list(result.missing_keys), list(result.unexpected_keys))
    with torch.no_grad():
        for key, target in own.items():
            if key in state_dict and _is_sharded(target):
                target.to_local().copy_(_local_shard(state_dict[key], target))
            elif key in state_dict:
                target.copy_(state_dict[key])
    return LoadReport([k for k in own if k not in state_dict],
                      [k for k in state_dict if k not in own])


def load_state_dict_reported(model: nn.Module, state_dict: StateDict,
                             source: str = 'checkpoint') -> LoadReport:
    """Load a converted state dict; refuse shape mismatches; warn once about leftover keys.

    Derived buffers that the model rebuilds itself (:data:`DERIVED_KEYS`) never count as
    missing.
    """
    own = model.state_dict()
    state_dict = OrderedDict(state_dict)
    for k in own:  # derived buffers are rebuilt by the model, never taken from a file
        if k.endswith(DERIVED_KEYS):
            state_dict[k] = own[k]
    bad = [f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}'
           for k, v in state_dict.items() if k in own and own[k].shape != v.shape]
    if bad:
        raise ValueError(f'{source} does not fit {type(model).__name__} (different architecture?)'
                         ': ' + '; '.join(bad[:8]) + (f' (+{len(bad) - 8} more)' if len(bad) > 8
                                                     else ''))
    report = _load(model, own, state_dict)
    if report.missing or report.unexpected:
        parts = []
        if report.missing:
            parts.append(f'missing in {source} (left as initialised): {", ".join(report.missing)}')
        if report.unexpected:
            parts.append(f'unused from {source}: {", ".join(report.unexpected)}')
        warnings.warn(f'{type(model).__name__}: ' + ' | '.join(parts), stacklevel=2)
    return report


def load_pretrained(model: nn.Module, checkpoint: str, prefix: Optional[str] = None,
                    map_location='cpu', mmap: bool = False) -> LoadReport:
    """Load the checkpoint ``checkpoint`` (a file, sharded index, HuggingFace snapshot
    directory or URL, read by :func:`~mmvitswin.core.checkpoint.files.read_checkpoint`) into
    ``model`` (see :func:`load_pretrained_dict`), passing its ``config.json`` when it has one.
    ``mmap``: the file stays mapped and each tensor is read when copied (into a sharded
    model: only this process's piece of it)."""
    ckpt = read_checkpoint(checkpoint, map_location=map_location, mmap=mmap)
    return load_pretrained_dict(model, ckpt.obj, source=str(checkpoint), prefix=prefix,
                                config=ckpt.config)


def load_pretrained_dict(model: nn.Module, ckpt, source: str = 'checkpoint',
                         prefix: Optional[str] = None,
                         config: Optional[dict] = None) -> LoadReport:
    """Load a checkpoint already read into memory (``ckpt``: what the file held, or a
    :class:`~mmvitswin.core.checkpoint.files.Checkpoint`, whose config is then used unless
    ``config`` is given) into ``model`` through its ``convert_checkpoint(state_dict, config)``.

    The backbone's converter detects the format, renames keys to our layout, checks the
    architecture (against ``config``, the checkpoint's parsed ``config.json``, too) and
    resizes position tables to the model; this function does the rest (see module docstring).
    """
    if isinstance(ckpt, Checkpoint):
        config = ckpt.config if config is None else config
        ckpt = ckpt.obj
    try:
        sd = unwrap_state_dict(ckpt, prefix=prefix)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(source, 'not a checkpoint', str(exc)) from None
    if not sd:
        raise CheckpointError(source, 'not a checkpoint', 'it holds no tensors')
    name = type(model).__name__
    convert = getattr(model, 'convert_checkpoint', None)
    if convert is not None:
        try:
            sd = convert(sd) if config is None else convert(sd, config=config)
        except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as exc:
            raise CheckpointError(source, 'other model', f'its weights do not belong to this '
                                  f'{name}: {exc}') from None
    own = model.state_dict()
    if not any(k in own for k in sd):
        raise CheckpointError(source, 'other model', f'none of its {len(sd)} tensors (e.g. '
                              f'{sorted(sd)[:3]}) is a parameter of this {name}')
    try:
        return load_state_dict_reported(model, sd, source=source)
    except ValueError as exc:  # shapes refused before anything was copied
        raise CheckpointError(source, 'other model', str(exc)) from None

"""What tools/train.py and tools/test.py do to a config before MMEngine's Runner sees it.

The same tools serve mmdet and mmseg configs (the config's ``default_scope`` picks the host).
Fixes for this stack that they apply:

- CPU-only machines: MMEngine's ``init_dist`` calls ``torch.cuda.set_device`` and the configs
  ask for NCCL, and its DDP wrapper passes ``device_ids=[LOCAL_RANK]``, which DDP rejects for a
  CPU module. :func:`prepare_config` switches to gloo and drops ``device_ids``;
  :func:`init_distributed` creates the gloo process group itself.
- ``SyncBN`` (mmseg's UPerNet heads) needs a distributed run on CUDA; anywhere else it becomes
  ``BN`` in the config, before the model is built.
- ``persistent_workers=True`` with ``num_workers=0`` makes PyTorch's DataLoader raise.
- ``--amp`` on a CPU-only machine: MMEngine's ``AmpOptimWrapper`` refuses CPU, so it trains in
  bf16 through our ``CPUAmpOptimWrapper`` (:mod:`mmvitswin.openmmlab.engine.amp`).
- A config that names no ``runner_type`` runs on our ``SafeCheckpointRunner``
  (:mod:`mmvitswin.openmmlab.engine.runner`: weights-only ``--resume``/``load_from`` under
  torch >= 2.6, atomic checkpoint files, resume from the newest complete checkpoint).

Every user error is a :class:`ToolError`: the tools print it and exit with status 2.
"""
import os
import os.path as osp
from typing import Any, List, Optional

import torch
from mmengine.config import Config, ConfigDict
from mmengine.registry import RUNNERS

from ...core.backbones.vit import fp16_refusal
from .amp import apply_amp, resolve_amp_dtype
from .checkpoint_io import is_sharded_checkpoint
from .safe_load import UntrustedCheckpointError, check_trusted

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')
DEFAULT_RUNNER = 'mmvitswin.SafeCheckpointRunner'
DATALOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


class ToolError(Exception):
    """A problem with the command line, config or data that the user must fix (exit 2)."""


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Read a config file (importing its ``custom_imports``) and apply ``--cfg-options``."""
    if not osp.isfile(path):
        raise ToolError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def _config_dicts(node: Any, path: str = 'model'):
    """Every dict of a nested config with its path (``model.roi_head.bbox_head``), each
    before the dicts inside it."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _config_dicts(value, f'{path}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _config_dicts(value, f'{path}[{i}]')


def replace_sync_bn(node: Any) -> int:
    """Turn every ``type='SyncBN'`` in a (nested) config into ``'BN'``; return how many."""
    count = 0
    for _, entry in _config_dicts(node):
        if entry.get('type') == 'SyncBN':
            entry['type'] = 'BN'
            count += 1
    return count


def _fix_workers(cfg: Config) -> None:
    for name in DATALOADERS:
        loader = cfg.get(name)
        if isinstance(loader, dict) and loader.get('num_workers', 1) == 0:
            loader['persistent_workers'] = False


def mmcv_roi_aligns(node: Any, path: str = 'model') -> List[str]:
    """The config paths of every ``roi_layer`` that builds mmcv's ``RoIAlign``."""
    found = []
    for where, entry in _config_dicts(node, path):
        layer = entry.get('roi_layer')
        kind = layer.get('type', '') if isinstance(layer, dict) else ''
        if not isinstance(kind, str):  # a class in a Python config
            kind = f'{kind.__module__}.{kind.__name__}'
        if kind.split('.')[-1] == 'RoIAlign' and not kind.startswith('mmvitswin'):
            found.append(f'{where}.roi_layer')
    return found


def prepare_config(cfg: Config, config_path: str, launcher: str = 'none',
                   work_dir: Optional[str] = None, resume: Optional[str] = None,
                   load_from: Optional[str] = None, amp: bool = False,
                   cuda: Optional[bool] = None, amp_dtype: Optional[str] = None) -> List[str]:
    """Apply the command-line choices and the stack fixes (module docstring) to ``cfg``.

    ``resume``: None (config decides), ``'auto'`` (latest checkpoint in the work dir) or a
    checkpoint path. ``load_from``: weights to start from (tools/test.py's checkpoint).
    ``amp``: mixed precision, ``amp_dtype`` 'bf16' | 'fp16' | None (bf16 on CPU through our
    ``CPUAmpOptimWrapper``, fp16 on CUDA through MMEngine's ``AmpOptimWrapper``; see
    :mod:`mmvitswin.openmmlab.engine.amp`).
    Returns human-readable notes about what was changed, for the log.
    """
    if launcher not in LAUNCHERS:
        raise ToolError(f'--launcher must be one of {LAUNCHERS}, got {launcher!r}')
    cuda = torch.cuda.is_available() if cuda is None else cuda
    notes = []
    cfg.launcher = launcher  # Runner.from_cfg reads it: without it every rank trains alone

    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])

    if resume is not None:
        cfg.resume = True
        if resume == 'auto':
            cfg.load_from = None  # the Runner finds the latest checkpoint in work_dir
        else:
            _check_checkpoint(resume, '--resume')
            cfg.load_from = resume
    if load_from is not None:
        _check_checkpoint(load_from, 'checkpoint')
        cfg.load_from = load_from

    note = select_runner(cfg)
    if note:
        notes.append(note)

    if amp:
        try:
            notes.append(apply_amp(cfg.optim_wrapper, cuda, amp_dtype))
            bf16_on_cuda = cuda and resolve_amp_dtype(amp_dtype, cuda) == 'bf16'
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        if resolve_amp_dtype(amp_dtype, cuda) == 'fp16' and 'model' in cfg:
            why = fp16_refusal_of(cfg.model)
            if why:
                raise ToolError(f'--amp in fp16 (the default on CUDA): {why}')
        if bf16_on_cuda and 'model' in cfg:
            places = mmcv_roi_aligns(cfg.model)
            if places:
                raise ToolError(
                    f'--amp-dtype bf16 on CUDA: mmcv\'s RoIAlign ({", ".join(places)}) has no '
                    'bf16 CUDA kernel and would fail at the first iteration. Train with fp16 '
                    '(--amp alone, the default on CUDA), or set that roi_layer to '
                    "dict(type='mmvitswin.SeparableRoIAlign', output_size=..., sampling_ratio=0) "
                    '(any dtype; written for CPUs, slower than mmcv\'s kernel on a GPU).')

    distributed = launcher != 'none'
    if not (distributed and cuda) and 'model' in cfg:
        n = replace_sync_bn(cfg.model)
        if n:
            why = 'not distributed' if not distributed else 'no CUDA device'
            notes.append(f'SyncBN -> BN in {n} place(s) of the model ({why})')
    if distributed and not cuda:
        if launcher != 'pytorch':
            raise ToolError(f'--launcher {launcher} needs CUDA here; on CPU use the pytorch '
                            'launcher (tools/dist_train.sh, torchrun), which runs on gloo.')
        cfg.setdefault('env_cfg', ConfigDict())
        cfg.env_cfg.setdefault('dist_cfg', ConfigDict())
        cfg.env_cfg.dist_cfg.backend = 'gloo'
        wrapper_cfg = cfg.get('model_wrapper_cfg') or ConfigDict(
            type='MMDistributedDataParallel', broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))
        # An explicit None wins over the Runner's default device_ids=[LOCAL_RANK].
        wrapper_cfg['device_ids'] = None
        cfg.model_wrapper_cfg = wrapper_cfg
        notes.append('distributed on CPU: gloo backend, DDP without device_ids')
    _fix_workers(cfg)
    return notes


def fp16_refusal_of(model: dict) -> Optional[str]:
    """Why the model config's backbone refuses float16 (a DINOv3-style ViT trunk), or None."""
    backbone = model.get('backbone') if isinstance(model, dict) else None
    if not isinstance(backbone, dict):
        return None
    kind = backbone.get('type', '')
    kind = kind.split('.')[-1] if isinstance(kind, str) else getattr(kind, '__name__', '')
    return fp16_refusal(backbone) if kind in ('ViTAdapter', 'HybridViT') else None


def select_runner(cfg: Config) -> Optional[str]:
    """Give a config that names no ``runner_type`` our ``SafeCheckpointRunner``; returns a note
    for the log when it did (a config's own choice is kept)."""
    if cfg.get('runner_type') is not None:
        return None
    cfg.runner_type = DEFAULT_RUNNER
    return (f'runner: {DEFAULT_RUNNER.split(".")[-1]} (weights-only resume/load_from, atomic '
            'checkpoints); the config names no runner_type')


def build_runner(cfg: Config):
    """The runner ``cfg.runner_type`` names (:func:`select_runner` first, if it names none),
    built by MMEngine's ``RUNNERS`` in the config's scope."""
    select_runner(cfg)
    return RUNNERS.build(cfg)


def _check_checkpoint(path: str, what: str) -> None:
    """Exists and would pass the safe loader (checked on the pickle only, without tensors)."""
    if '://' in path:
        return
    path = osp.expanduser(path)
    if is_sharded_checkpoint(path):  # FSDP2Strategy's (engine/fsdp.py): tensors, no pickle
        return
    if not osp.isfile(path):
        raise ToolError(f'{what} file not found: {path}')
    try:
        check_trusted(path)
    except UntrustedCheckpointError as exc:
        raise ToolError(str(exc)) from None


def init_distributed(launcher: str, cuda: Optional[bool] = None) -> None:
    """Create the gloo process group for a CPU ``pytorch`` launch (MMEngine cannot, see top).

    With CUDA (or launcher 'none') this does nothing and the Runner initialises as usual.
    """
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if launcher != 'pytorch' or cuda:
        return
    dist = torch.distributed
    if dist.is_initialized():
        return
    missing = [k for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')
               if k not in os.environ]
    if missing:
        raise ToolError(f'--launcher pytorch expects the torchrun environment; missing '
                        f'{", ".join(missing)}. Start it with tools/dist_train.sh or torchrun.')
    dist.init_process_group(backend='gloo')

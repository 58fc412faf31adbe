"""FSDP2 training on MMEngine's ``FlexibleRunner``: a strategy a config names.

    runner_type = 'FlexibleRunner'
    strategy = dict(type='mmvitswin.FSDP2Strategy',
                    mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32'))

:class:`FSDP2Strategy` shards the model with ``torch.distributed.fsdp.fully_shard``: every
transformer block of the backbone (``shard_units``: the ViT trunk's blocks, Swin's blocks, the
interaction adapter's injectors and extractors) is its own unit, gathered just before it runs
and freed after, and the rest of the model (embeddings, pyramid, neck, heads) is the root unit.
Each process then holds ``1 / world_size`` of every parameter, gradient and optimizer state.
Per-block activation checkpointing (the backbones' ``with_cp``) composes with it: the
recomputation gathers the block again.

Mixed precision (``mixed_precision``) applies to the trunk's blocks (``low_precision_units``):
their parameters are gathered in ``param_dtype``, gradients are reduced in ``reduce_dtype``,
outputs come back in fp32 so the adapter, neck and heads run in fp32 (RoIAlign and the losses
need it); the sharded master copy stays fp32. ``--amp`` (autocast) composes with it.

Checkpoints are **sharded**: ``iter_N.pth`` is a directory written by
``torch.distributed.checkpoint`` (each process writes its shards; ``.metadata`` says where every
piece is) plus ``runner.pth`` (meta, message hub, schedulers: what is not a tensor). A save is
atomic: the directory is written under a hidden temporary name and renamed when every process
has finished, so a process killed mid-save leaves the previous checkpoint as it was, and
``--resume`` continues from the newest complete one. :func:`consolidate_checkpoint` (also
``tools/convert_checkpoint.py SHARDED_DIR OUT_FILE``) turns one into a single-file runner checkpoint
for ``tools/test.py`` and DDP users; a single-file checkpoint loads here as ``load_from``.
"""
import contextlib
import copy
import os
import os.path as osp
import shutil
import tempfile
import time
from typing import Callable, Iterable, Optional, Sequence, Union

import mmengine
import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine._strategy import DDPStrategy
from mmengine.device import get_device

from ...core.backbones.vit import FP16_REFUSAL
from ...core.checkpoint import load_pretrained
from ..registry import STRATEGIES
from .checkpoint_io import (_TMP_MARK, METADATA, RUNNER_STATE, _fsync, _remove_stale_tmp,
                            _tmp_path, atomic_write, find_latest_complete_checkpoint,
                            is_complete_checkpoint, is_sharded_checkpoint)
from .safe_load import load_runner_checkpoint, safe_torch_load

try:  # torch >= 2.6
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    HAS_FSDP2 = True
except ImportError:  # torch 2.1: no fully_shard in torch.distributed.fsdp
    HAS_FSDP2 = False

DTYPES = {'float32': torch.float32, 'fp32': torch.float32, 'bfloat16': torch.bfloat16,
          'bf16': torch.bfloat16, 'float16': torch.float16, 'fp16': torch.float16}


def _dtype(value, what: str) -> Optional[torch.dtype]:
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in DTYPES:
        raise ValueError(f'{what} must be one of {sorted(DTYPES)} or None, got {value!r}')
    return DTYPES[value]


def _is_a(module: nn.Module, names: Iterable[str]) -> bool:
    """Is ``module``'s class, or one of its base classes, named in ``names``?"""
    return any(c.__name__ in names for c in type(module).__mro__)


def _units(model: nn.Module, names: Iterable[str]) -> list:
    """The modules of ``model`` that :func:`_is_a` one of ``names``, children before parents
    (the order ``fully_shard`` needs)."""
    return [m for m in model.modules() if m is not model and _is_a(m, names)][::-1]


# ------------------------------------------------------------------------ sharded files
def save_sharded(path: str, tensors: dict, runner_state: dict) -> None:
    """Write the sharded checkpoint ``path`` (a directory) from every process: ``tensors``
    (DTensor state dicts) through ``torch.distributed.checkpoint``, ``runner_state`` by rank 0.
    The directory appears under its name only once complete (module docstring)."""
    path = osp.abspath(path)
    head, tail = osp.split(path)
    rank = dist.get_rank() if dist.is_initialized() else 0
    tmp = [_tmp_path(path)]  # rank 0's pid names it
    if dist.is_initialized():
        dist.broadcast_object_list(tmp, src=0)
    tmp = tmp[0]
    if rank == 0:
        os.makedirs(head, exist_ok=True)
        _remove_stale_tmp(path)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    if dist.is_initialized():
        dist.barrier()
    dcp.save(tensors, checkpoint_id=tmp)
    if rank == 0:
        torch.save(runner_state, osp.join(tmp, RUNNER_STATE))
        for name in os.listdir(tmp):
            _fsync(osp.join(tmp, name))
        _publish(tmp, path)
    if dist.is_initialized():
        dist.barrier()


def _publish(tmp: str, path: str) -> None:
    """Rename the finished directory ``tmp`` to ``path`` (replacing an older one, set aside
    under a name the next save's stale cleanup removes if this process dies here)."""
    aside = None
    if osp.lexists(path):
        aside = f'{osp.dirname(path)}/.{osp.basename(path)}{_TMP_MARK}old-{os.getpid()}'
        os.replace(path, aside)
    os.replace(tmp, path)
    if aside is not None and osp.isdir(aside):
        shutil.rmtree(aside, ignore_errors=True)
    elif aside is not None:
        os.remove(aside)
    with contextlib.suppress(OSError):  # make the rename itself durable
        _fsync(osp.dirname(path))


def read_sharded(path: str) -> dict:
    """Every tensor of a sharded checkpoint as one plain state dict, plus its runner state, in
    this process (no process group needed): what a single-file runner checkpoint holds."""
    if not is_sharded_checkpoint(path):
        raise FileNotFoundError(f'{path} is not a complete sharded checkpoint (a directory '
                                f'with {METADATA} and {RUNNER_STATE})')
    checkpoint = load_runner_checkpoint(osp.join(path, RUNNER_STATE), map_location='cpu')
    with tempfile.TemporaryDirectory(dir=osp.dirname(osp.abspath(path))) as tmp:
        file = osp.join(tmp, 'tensors.pth')
        dcp_to_torch_save(path, file)
        checkpoint.update(safe_torch_load(file, map_location='cpu'))
    return checkpoint


def consolidate_checkpoint(path: str, out_file: str) -> str:
    """Write the sharded checkpoint ``path`` as one runner checkpoint file ``out_file`` (what
    ``tools/test.py`` and a DDP ``load_from`` read), without the optimizer state: it is keyed
    by parameter name, which a plain optimizer cannot read back."""
    checkpoint = read_sharded(path)
    checkpoint.pop('optimizer', None)
    atomic_write(out_file, lambda tmp: torch.save(checkpoint, tmp))
    return out_file


# ------------------------------------------------------------------------------ strategy
@STRATEGIES.register_module()
class FSDP2Strategy(DDPStrategy):
    """Fully sharded data parallel training (FSDP2) for ``FlexibleRunner`` (module docstring).

    Args:
        shard_units: class names of the modules sharded as their own unit (a subclass counts).
        low_precision_units: the units ``mixed_precision`` applies to.
        mixed_precision: ``dict(param_dtype=..., reduce_dtype=...)`` ('bfloat16', 'float16',
            'float32' or None); None: everything in fp32. float16 is refused for a DINOv3-style
            trunk (``rope_theta``), which is not supported in fp16.
        reshard_after_forward: free each unit's gathered parameters after its forward (and
            gather them again for the backward): the least memory. False keeps them until
            the backward (less communication, more memory).
        meta_init: build the backbone's blocks without memory (``block_device='meta'``),
            shard them, then fill each process's shards straight from the backbone's
            ``Pretrained`` checkpoint (memory-mapped: each process reads its pieces): no
            process ever holds the whole trunk. Every block parameter must be in the file.
        **kwargs: MMEngine's ``DDPStrategy`` arguments (``sync_bn``, ...).
    """

    def __init__(self, *,
                 shard_units: Sequence[str] = ('ViTBlock', 'SwinBlockBase', 'Injector',
                                               'Extractor'),
                 low_precision_units: Sequence[str] = ('ViTBlock', 'SwinBlockBase'),
                 mixed_precision: Optional[dict] = None,
                 reshard_after_forward: bool = True, meta_init: bool = False, **kwargs):
        if not HAS_FSDP2:
            raise RuntimeError('FSDP2Strategy needs torch.distributed.fsdp.fully_shard '
                               f'(torch >= 2.6); this is torch {torch.__version__}')
        super().__init__(**kwargs)
        self.shard_units = tuple(shard_units)
        self.low_precision_units = tuple(low_precision_units)
        mp = dict(mixed_precision or {})
        unknown = set(mp) - {'param_dtype', 'reduce_dtype'}
        if unknown:
            raise ValueError(f'mixed_precision takes param_dtype and reduce_dtype, got '
                             f'{sorted(unknown)}')
        self.param_dtype = _dtype(mp.get('param_dtype'), 'mixed_precision.param_dtype')
        self.reduce_dtype = _dtype(mp.get('reduce_dtype'), 'mixed_precision.reduce_dtype')
        self.reshard_after_forward = reshard_after_forward
        self.meta_init = meta_init
        self._pretrained: Optional[dict] = None

    def build_model(self, model: Union[nn.Module, dict]) -> nn.Module:
        """With ``meta_init``, the backbone's blocks are built on the meta device and its
        ``Pretrained`` checkpoint is kept for :meth:`_wrap_model` to load into the shards."""
        if not self.meta_init or isinstance(model, nn.Module):
            return super().build_model(model)
        model = copy.deepcopy(model)
        backbone = model.get('backbone')
        init = backbone.get('init_cfg') if isinstance(backbone, dict) else None
        if not (isinstance(init, dict) and init.get('type') == 'Pretrained'):
            raise ValueError('FSDP2Strategy(meta_init=True) fills the backbone\'s blocks from '
                             'its pretrained checkpoint: model.backbone.init_cfg must be '
                             f"dict(type='Pretrained', checkpoint=...), got {init!r}")
        self._pretrained = dict(init)
        backbone.update(init_cfg=None, block_device='meta')
        return super().build_model(model)

    # ------------------------------------------------------------------------- sharding
    def _setup_distributed(self, launcher: str = 'pytorch', backend: str = 'nccl', **kwargs):
        if not torch.cuda.is_available():
            backend = 'gloo'
        super()._setup_distributed(launcher, backend, **kwargs)

    def _wrap_model(self, model: nn.Module) -> nn.Module:
        if isinstance(model, FSDPModule):
            return model
        if not dist.is_initialized():
            raise RuntimeError(
                'FSDP2Strategy shards the model over the processes of a distributed launch: '
                'start it with tools/dist_train.sh CONFIG NUM_PROCS (or torchrun ... '
                '--launcher pytorch)')
        if self.param_dtype == torch.float16:
            for module in model.modules():
                if getattr(module, 'rope_theta', None) is not None:
                    raise ValueError(f'FSDP2Strategy mixed_precision float16: {FP16_REFUSAL}')
        device = get_device()
        with self._meta_blocks_aside(model):
            model = self.convert_model(model.to(device))
        mesh = torch.distributed.device_mesh.init_device_mesh(
            'cuda' if device == 'cuda' else 'cpu', (dist.get_world_size(),))
        fp32 = MixedPrecisionPolicy(reduce_dtype=self.reduce_dtype)
        low = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype,
                                   output_dtype=torch.float32 if self.param_dtype else None)
        units = _units(model, self.shard_units)
        if not units:
            raise ValueError(f'FSDP2Strategy: no module of {type(model).__name__} is one of '
                             f'shard_units={self.shard_units}')
        for unit in units:
            lowp = _is_a(unit, self.low_precision_units)
            fully_shard(unit, mesh=mesh, mp_policy=low if lowp else fp32,
                        reshard_after_forward=self.reshard_after_forward)
        fully_shard(model, mesh=mesh, mp_policy=fp32,
                    reshard_after_forward=self.reshard_after_forward)
        if self._pretrained is not None:
            self._load_into_shards(model, units, device)
        self.logger.info(f'FSDP2: {len(units)} units + the root over {dist.get_world_size()} '
                         f'processes; parameters gathered in {self.param_dtype or "fp32"} in '
                         f'{", ".join(self.low_precision_units)}')
        return model

    @contextlib.contextmanager
    def _meta_blocks_aside(self, model: nn.Module):
        """With ``meta_init``: the backbone's (meta) blocks out of the model for what cannot
        touch them (initialisation, moving to the device; :meth:`_load_into_shards` gives them
        memory and values)."""
        if self._pretrained is None:
            yield
            return
        blocks = model.backbone.blocks
        model.backbone.blocks = nn.ModuleList()
        try:
            yield
        finally:
            model.backbone.blocks = blocks

    def _init_model_weights(self, model: nn.Module) -> nn.Module:
        with self._meta_blocks_aside(model):
            return super()._init_model_weights(model)

    def _load_into_shards(self, model: nn.Module, units: list, device: str) -> None:
        """``meta_init``: give the meta blocks memory for their shards (their buffers kept)
        and fill them from the pretrained checkpoint; a block parameter the file lacks would
        hold no value: an error naming it."""
        for unit in units:
            if any(p.is_meta for p in unit.parameters()):
                buffers = {n: b.clone() for n, b in unit.named_buffers()}
                unit.to_empty(device=device)
                with torch.no_grad():
                    for name, buf in unit.named_buffers():
                        buf.copy_(buffers[name])
        backbone = model.backbone
        ckpt = self._pretrained
        report = load_pretrained(backbone, ckpt['checkpoint'], prefix=ckpt.get('prefix'),
                                 mmap=True)
        unfilled = [k for k in report.missing if k.startswith('blocks.')]
        if unfilled:
            raise ValueError(f'FSDP2Strategy(meta_init=True): {ckpt["checkpoint"]} has no '
                             f'{unfilled[0]} (and {len(unfilled) - 1} more block tensors): '
                             'blocks built on the meta device hold no values of their own')
        self.logger.info(f'FSDP2: the backbone\'s shards filled from {ckpt["checkpoint"]}')

    # ---------------------------------------------------------------------- state dicts
    def model_state_dict(self) -> dict:
        """The whole model's state (every process gathers; all tensors on the CPU)."""
        return get_model_state_dict(self.model, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))

    def optim_state_dict(self) -> dict:
        """This process's shards of the optimizer state, keyed by parameter name, with the
        optim wrapper's own state (a loss scaler's)."""
        state = get_optimizer_state_dict(self.model, self.optim_wrapper.optimizer)
        wrapper = self.optim_wrapper.state_dict()
        state.update({k: v for k, v in wrapper.items() if k not in ('state', 'param_groups')})
        return state

    def load_optim_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        scaler = state_dict.pop('loss_scaler', None)
        set_optimizer_state_dict(self.model, self.optim_wrapper.optimizer, state_dict)
        if scaler is not None and hasattr(self.optim_wrapper, 'loss_scaler'):
            self.optim_wrapper.loss_scaler.load_state_dict(scaler)

    # ---------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, filename: str, *, save_optimizer: bool = True,
                        save_param_scheduler: bool = True, extra_ckpt: Optional[dict] = None,
                        callback: Optional[Callable] = None) -> None:
        """A sharded checkpoint directory ``filename``, written by every process (module
        docstring)."""
        checkpoint = dict(extra_ckpt or {})
        checkpoint.setdefault('meta', {}).update(
            seed=self.seed, time=time.strftime('%Y%m%d_%H%M%S', time.localtime()),
            mmengine=mmengine.__version__, world_size=dist.get_world_size())
        checkpoint['state_dict'] = get_model_state_dict(self.model)
        if save_optimizer and hasattr(self, 'optim_wrapper'):
            checkpoint['optimizer'] = self.optim_state_dict()
        if save_param_scheduler and hasattr(self, 'param_schedulers'):
            checkpoint['param_schedulers'] = self.scheduler_state_dict()
        if callback is not None:
            callback(checkpoint)
        tensors = {k: checkpoint.pop(k) for k in ('state_dict', 'optimizer') if k in checkpoint}
        save_sharded(filename, tensors, checkpoint)

    def load_checkpoint(self, filename: str, *, map_location: Union[str, Callable] = 'cpu',
                        strict: bool = False, revise_keys: list = [(r'^module.', '')],
                        callback: Optional[Callable] = None) -> dict:
        """A sharded checkpoint (each process reads its shards, and the optimizer's when there
        is an optim wrapper), or a single-file runner checkpoint (weights only: every process
        reads the file and keeps its shards). Returns the runner state."""
        if not osp.isdir(filename):
            checkpoint = load_runner_checkpoint(filename, map_location='cpu')
            if callback is not None:
                callback(checkpoint)
            state = checkpoint.pop('state_dict', checkpoint)
            state = {k[len('module.'):] if k.startswith('module.') else k: v
                     for k, v in state.items()}
            self._report_keys(set(state), strict)
            set_model_state_dict(self.model, state, options=StateDictOptions(
                full_state_dict=True, strict=strict))
            checkpoint.pop('optimizer', None)  # keyed by position: not this model's
            self.logger.info(f'Load checkpoint (weights) from {filename}')
            return checkpoint
        if not is_sharded_checkpoint(filename):
            raise FileNotFoundError(f'{filename}: not a complete sharded checkpoint '
                                    f'({is_complete_checkpoint(filename)})')
        stored = dcp.FileSystemReader(filename).read_metadata().state_dict_metadata
        tensors = {'state_dict': get_model_state_dict(self.model)}
        with_optimizer = hasattr(self, 'optim_wrapper') and any(
            k.startswith('optimizer.') for k in stored)
        if with_optimizer:
            tensors['optimizer'] = self.optim_state_dict()
        self._report_keys({k[len('state_dict.'):] for k in stored
                           if k.startswith('state_dict.')}, strict)
        dcp.load(tensors, checkpoint_id=filename,
                 planner=dcp.DefaultLoadPlanner(allow_partial_load=not strict))
        set_model_state_dict(self.model, tensors['state_dict'],
                             options=StateDictOptions(strict=strict))
        checkpoint = load_runner_checkpoint(osp.join(filename, RUNNER_STATE), map_location='cpu')
        if with_optimizer:
            checkpoint['optimizer'] = tensors['optimizer']
        if callback is not None:
            callback(checkpoint)
        self.logger.info(f'Load sharded checkpoint from {filename}')
        return checkpoint

    def _report_keys(self, stored: set, strict: bool) -> None:
        """Missing and unexpected model keys: an error when ``strict``, else a warning."""
        own = set(get_model_state_dict(self.model))
        missing, unexpected = sorted(own - stored), sorted(stored - own)
        if not (missing or unexpected):
            return
        text = (f'checkpoint and model differ: missing {missing[:8]}{"..." * (len(missing) > 8)}'
                f', unexpected {unexpected[:8]}{"..." * (len(unexpected) > 8)}')
        if strict:
            raise KeyError(text)
        self.logger.warning(text)

    def resume(self, filename: str, **kwargs) -> dict:
        """MMEngine's resume from a sharded checkpoint; ``filename`` not complete (a pointer
        to a save that never finished) falls back to the newest complete one beside it."""
        if not is_sharded_checkpoint(filename):
            latest = find_latest_complete_checkpoint(osp.dirname(osp.abspath(filename)))
            if latest is None or not is_sharded_checkpoint(latest):
                raise FileNotFoundError(
                    f'resume under FSDP2Strategy needs a sharded checkpoint it saved; '
                    f'{filename} is not one (a single-file checkpoint can start a run as '
                    'load_from, without its optimizer state)')
            self.logger.warning(f'resume: {filename} is not a complete sharded checkpoint; '
                                f'resuming from {latest}')
            filename = latest
        return super().resume(filename, **kwargs)


"""Mixed precision through MMEngine's Runner, CPU included.

MMEngine's ``AmpOptimWrapper`` asserts a CUDA/NPU/MLU/MUSA device, so ``--amp`` on a CPU-only
machine gets :class:`CPUAmpOptimWrapper` instead: the forward (data preprocessor + loss) runs
under ``torch.autocast('cpu', dtype=torch.bfloat16)`` through ``optim_context``, the backward and
the optimizer step outside it, with no loss scaling (bf16 has fp32's exponent range, so gradients
do not underflow). On CUDA ``--amp`` keeps MMEngine's ``AmpOptimWrapper``: fp16 with dynamic loss
scaling (mmdet's default), or bf16 with the scale fixed at 1. :func:`apply_amp` makes that choice
for a config; :class:`AmpTestLoop` is ``tools/test.py --amp`` (``test_step`` under autocast).
mmcv's CPU kernels (``nms``, ``RoIAlign``, ...) have no bf16: both keep the tensors that reach
them fp32 with forward hooks on the model they run (:func:`keep_mmcv_ops_fp32`); mmcv itself
is not changed.
"""
import importlib.util
import weakref
from contextlib import contextmanager
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.optim import OptimWrapper
from mmengine.runner import TestLoop
from mmengine.structures import BaseDataElement

from ..registry import LOOPS, OPTIM_WRAPPERS
from ...core import compat

if importlib.util.find_spec('mmdet') is not None:  # its heads feed mmcv's nms
    from mmdet.models.dense_heads.base_dense_head import BaseDenseHead
    from mmdet.models.roi_heads.bbox_heads import BBoxHead
else:  # an mmseg-only install: no such heads
    BaseDenseHead = BBoxHead = None

AMP_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}
_TORCH_NAMES = {'bfloat16': 'bf16', 'float16': 'fp16', 'bf16': 'bf16', 'fp16': 'fp16'}


def amp_dtype_name(dtype: Any) -> str:
    """'bf16' | 'fp16' from a short name, a torch name ('bfloat16') or a torch dtype."""
    key = str(dtype).replace('torch.', '')
    if key not in _TORCH_NAMES:
        raise ValueError(f"mixed-precision dtype must be bf16 or fp16, got {dtype!r}")
    return _TORCH_NAMES[key]


def cpu_bf16_support() -> Tuple[bool, str]:
    """Whether this CPU runs bf16 matrix products natively (AMX-BF16 or AVX512-BF16) under
    oneDNN, and what was found. Without them bf16 is emulated and slower than fp32."""
    if not torch.backends.mkldnn.is_available():
        return False, 'torch built without oneDNN'
    found = []
    for name, label in (('_is_amx_tile_supported', 'AMX'),
                        ('_is_avx512_bf16_supported', 'AVX512-BF16')):
        probe = getattr(torch.cpu, name, None)
        try:
            if probe is not None and probe():
                found.append(label)
        except RuntimeError:  # pragma: no cover - a probe that cannot run here
            pass
    if found:
        return True, '+'.join(found)
    return False, 'no AMX-BF16 / AVX512-BF16 instructions'


# Where a bf16/fp16 CPU tensor would reach an mmcv kernel without a low-precision CPU version
# ("expected scalar type Float but found BFloat16"): the inputs of mmcv.ops modules (RoIAlign,
# RoIPool, ...) and the outputs of mmdet's heads, which their post-processing hands to mmcv's
# nms (RPN proposals, test-time boxes).
_FP32_OUTPUT_HEADS = tuple(cls for cls in (BaseDenseHead, BBoxHead) if cls is not None)
_GUARDED: 'weakref.WeakSet[nn.Module]' = weakref.WeakSet()


def _is_mmcv_op(module: nn.Module) -> bool:
    return type(module).__module__.startswith('mmcv.ops.')


class _Fp32Op:
    """Forward hooks that run an mmcv op module in fp32 when it is given bf16/fp16 tensors and
    hand its outputs back in that dtype (a half kernel's contract: mmdet's RoI extractor
    writes them into a buffer of the features' dtype)."""

    def __init__(self):
        self.dtypes: List[Optional[torch.dtype]] = []  # one per call in progress

    def before(self, module: nn.Module, args: tuple, kwargs: dict):
        low = next((v.dtype for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)
                    and v.device.type == 'cpu' and v.dtype in compat.LOW_PRECISION), None)
        self.dtypes.append(low)
        if low is None:
            return None
        return (compat.cast_floats(args, torch.float32, only=compat.LOW_PRECISION),
                compat.cast_floats(kwargs, torch.float32, only=compat.LOW_PRECISION))

    def after(self, module: nn.Module, args: tuple, output: Any):
        low = self.dtypes.pop()
        if low is None:
            return None
        return compat.cast_floats(output, low, only=(torch.float32, ))


def _outputs_to_fp32(module: nn.Module, args: tuple, output: Any):
    return compat.cast_floats(output, torch.float32, only=compat.LOW_PRECISION)


def keep_mmcv_ops_fp32(model: nn.Module) -> int:
    """Let ``model`` run under CPU bf16 autocast although mmcv's CPU kernels have no bf16.

    Forward hooks on this model's modules (nothing of mmcv or mmdet is changed): every
    ``mmcv.ops`` module given bf16/fp16 CPU tensors computes in fp32 and returns that dtype;
    every mmdet dense head and bbox head returns fp32 (their post-processing calls mmcv's
    ``nms``, and their losses are then fp32 too). The convolutions and matrix products stay
    under autocast. Idempotent; returns how many modules it guarded.
    """
    guarded = 0
    for module in model.modules():
        if module in _GUARDED:
            continue
        if _is_mmcv_op(module):
            op = _Fp32Op()
            module.register_forward_pre_hook(op.before, with_kwargs=True)
            module.register_forward_hook(op.after)
        elif isinstance(module, _FP32_OUTPUT_HEADS):
            module.register_forward_hook(_outputs_to_fp32)
        else:
            continue
        _GUARDED.add(module)
        guarded += 1
    return guarded


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """bf16 mixed precision on CPU: ``optim_context`` adds ``torch.autocast('cpu', bf16)``.

    MMEngine's ``BaseModel.train_step`` runs the data preprocessor and the loss inside
    ``optim_context`` and calls ``update_params`` (backward, step) after it, so the backward
    runs outside autocast, as the AMP recipe requires. Parameters, gradients and optimizer
    state stay fp32; no loss scaling. mmcv's ops of the model it trains get fp32 tensors
    (:func:`keep_mmcv_ops_fp32`). Other arguments: ``OptimWrapper``'s.
    """

    def __init__(self, dtype: str = 'bfloat16', **kwargs):
        super().__init__(**kwargs)
        if amp_dtype_name(dtype) != 'bf16':
            raise ValueError('CPUAmpOptimWrapper runs bf16 only (fp16 on CPU needs loss scaling '
                             'and has no fast kernels); use AmpOptimWrapper on CUDA for fp16')
        self.cast_dtype = torch.bfloat16
        self._guarded: 'weakref.WeakSet[nn.Module]' = weakref.WeakSet()  # models seen
        MMLogger.get_current_instance().info(
            'CPUAmpOptimWrapper: precision bf16 (forward under torch.autocast("cpu", '
            'torch.bfloat16); backward, gradients and optimizer step in fp32; no loss scaling)')

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        param = next(model.parameters(), None)
        if param is not None and param.device.type != 'cpu':
            raise RuntimeError(f'CPUAmpOptimWrapper autocasts on CPU but the model is on '
                               f'{param.device}; use AmpOptimWrapper there')
        if model not in self._guarded:  # once per model, not every iteration
            keep_mmcv_ops_fp32(model)
            self._guarded.add(model)
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield


def samples_to_fp32(samples: Sequence) -> list:
    """Test outputs (data samples, possibly nested) with their bf16/fp16 tensors back in fp32,
    in place: metrics call ``.numpy()``, which has no bf16."""
    return [_element_to_fp32(s) if isinstance(s, BaseDataElement) else
            compat.cast_floats(s, torch.float32, only=compat.LOW_PRECISION) for s in samples]


def _element_to_fp32(element: BaseDataElement) -> BaseDataElement:
    metainfo_keys = set(element.metainfo_keys())
    for key, value in list(element.items()):
        value = _element_to_fp32(value) if isinstance(value, BaseDataElement) else \
            compat.cast_floats(value, torch.float32, only=compat.LOW_PRECISION)
        element.set_field(value, key,
                          field_type='metainfo' if key in metainfo_keys else 'data')
    return element


@LOOPS.register_module()
class AmpTestLoop(TestLoop):
    """``TestLoop`` whose ``test_step`` runs under ``torch.autocast`` (bf16 by default) on the
    model's device; the outputs go to the evaluator in fp32."""

    def __init__(self, runner, dataloader, evaluator, dtype: str = 'bfloat16'):
        super().__init__(runner, dataloader, evaluator)
        self.cast_dtype = AMP_DTYPES[amp_dtype_name(dtype)]
        param = next(self.runner.model.parameters(), None)
        self.device_type = param.device.type if param is not None else 'cpu'
        if self.device_type == 'cpu':
            keep_mmcv_ops_fp32(self.runner.model)
        MMLogger.get_current_instance().info(
            f'AmpTestLoop: precision {amp_dtype_name(dtype)} (test_step under torch.autocast('
            f'"{self.device_type}", {self.cast_dtype}); outputs evaluated in fp32)')

    @torch.no_grad()
    def run_iter(self, idx, data_batch) -> None:
        self.runner.call_hook('before_test_iter', batch_idx=idx, data_batch=data_batch)
        with torch.autocast(self.device_type, dtype=self.cast_dtype):
            outputs = self.runner.model.test_step(data_batch)
        outputs = samples_to_fp32(outputs)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        self.runner.call_hook('after_test_iter', batch_idx=idx, data_batch=data_batch,
                              outputs=outputs)


def resolve_amp_dtype(dtype: Optional[str], cuda: bool) -> str:
    """``--amp-dtype`` or the default: bf16 on CPU (the only choice there), fp16 on CUDA."""
    name = amp_dtype_name(dtype) if dtype else ('fp16' if cuda else 'bf16')
    if name == 'fp16' and not cuda:
        raise ValueError('--amp-dtype fp16 needs CUDA; on CPU --amp trains in bf16')
    return name


def apply_amp(optim_wrapper: dict, cuda: bool, dtype: Optional[str] = None) -> str:
    """Switch an ``optim_wrapper`` config (type ``OptimWrapper``, ``AmpOptimWrapper`` or ours)
    to mixed precision for this machine, in place; returns a note naming the precision."""
    name = resolve_amp_dtype(dtype, cuda)
    current = str(optim_wrapper.get('type', 'OptimWrapper')).split('.')[-1]
    if current not in ('OptimWrapper', 'AmpOptimWrapper', 'CPUAmpOptimWrapper'):
        raise ValueError(f'--amp works with optim_wrapper type OptimWrapper or AmpOptimWrapper, '
                         f'the config has {current}')
    if not cuda:
        optim_wrapper.pop('loss_scale', None)
        optim_wrapper.update(type='mmvitswin.CPUAmpOptimWrapper', dtype='bfloat16')
        return ('precision: bf16 mixed precision on CPU (CPUAmpOptimWrapper: autocast '
                'forward, fp32 backward and step, no loss scaling)')
    if name == 'fp16':
        optim_wrapper.update(type='AmpOptimWrapper', dtype='float16')
        optim_wrapper.setdefault('loss_scale', 'dynamic')
        return (f'precision: fp16 mixed precision on CUDA (AmpOptimWrapper, loss scale '
                f'{optim_wrapper["loss_scale"]})')
    # bf16 gradients do not underflow: a fixed scale of 1 leaves them as they are.
    optim_wrapper.update(type='AmpOptimWrapper', dtype='bfloat16', loss_scale=1.0)
    return 'precision: bf16 mixed precision on CUDA (AmpOptimWrapper, no loss scaling)'

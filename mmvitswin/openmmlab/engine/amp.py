"""Mixed precision through MMEngine's Runner, CPU included.

MMEngine's ``AmpOptimWrapper`` asserts a CUDA/NPU/MLU/MUSA device, so ``--amp`` on a CPU-only
machine gets :class:`CPUAmpOptimWrapper` instead: the forward (data preprocessor + loss) runs
under ``torch.autocast('cpu', dtype=torch.bfloat16)`` through ``optim_context``, the backward and
the optimizer step outside it, with no loss scaling (bf16 has fp32's exponent range, so gradients
do not underflow). On CUDA ``--amp`` keeps MMEngine's ``AmpOptimWrapper``: fp16 with dynamic loss
scaling (mmdet's default), or bf16 with the scale fixed at 1. :func:`apply_amp` makes that choice
for a config; :class:`AmpTestLoop` is ``tools/test.py --amp`` (``test_step`` under autocast).
"""
import sys
from contextlib import contextmanager
from typing import Any, Optional, Tuple

import torch
from mmengine.logging import MMLogger
from mmengine.optim import OptimWrapper
from mmengine.runner import TestLoop
from mmengine.structures import BaseDataElement

from ..registry import LOOPS, OPTIM_WRAPPERS

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
    if not found:  # older torch: read the kernel's view of the CPU
        try:
            with open('/proc/cpuinfo') as f:
                flags = next((line.split(':', 1)[1].split() for line in f
                              if line.startswith('flags')), [])
        except OSError:
            flags = []
        found = [label for flag, label in (('amx_bf16', 'AMX'), ('avx512_bf16', 'AVX512-BF16'))
                 if flag in flags]
    if found:
        return True, '+'.join(found)
    return False, 'no AMX-BF16 / AVX512-BF16 instructions'


_LOW = (torch.bfloat16, torch.float16)


def _cast(value: Any, dtype: torch.dtype, only=None) -> Any:
    """Floating CPU tensors in ``value`` (nested tuples/lists) cast to ``dtype`` (only those of
    a dtype in ``only``, if given)."""
    if isinstance(value, torch.Tensor):
        if (value.is_floating_point() and value.device.type == 'cpu'
                and (only is None or value.dtype in only)):
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype, only) for v in value)
    return value


def _low_dtype(args) -> Optional[torch.dtype]:
    for value in args:
        if isinstance(value, torch.Tensor) and value.device.type == 'cpu' and value.dtype in _LOW:
            return value.dtype
        if isinstance(value, (list, tuple)):
            found = _low_dtype(value)
            if found is not None:
                return found
    return None


def _fp32_forward(forward):
    def wrapped(ctx, *args, **kwargs):
        low = _low_dtype(args)
        ctx._mmvitswin_low_dtype = low
        if low is None:
            return forward(ctx, *args, **kwargs)
        with torch.autocast('cpu', enabled=False):
            out = forward(ctx, *_cast(args, torch.float32), **kwargs)
        return _cast(out, low, only=(torch.float32, ))
    return wrapped


def _fp32_backward(backward):
    def wrapped(ctx, *grads):
        if getattr(ctx, '_mmvitswin_low_dtype', None) is None:
            return backward(ctx, *grads)
        return backward(ctx, *_cast(grads, torch.float32))  # autograd casts the results back
    return wrapped


def mmcv_ops_accept_bf16_on_cpu() -> int:
    """Let mmcv's ops (nms, RoIAlign, ...) take bf16/fp16 CPU tensors, as under CPU autocast.

    Their CPU kernels have no bf16 ("expected scalar type Float but found BFloat16") and
    autocast does not know them. Each ``autograd.Function`` in ``mmcv.ops`` therefore computes
    in fp32 when an input is a low-precision CPU tensor and returns that dtype (a half kernel's
    contract), its backward likewise; fp32 and CUDA calls are untouched. Idempotent; returns
    how many functions this call wrapped.
    """
    try:
        import mmcv.ops  # noqa: F401
    except ImportError:
        return 0
    wrapped = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith('mmcv.ops.') or module is None:
            continue
        for obj in list(vars(module).values()):
            if (isinstance(obj, type) and issubclass(obj, torch.autograd.Function)
                    and obj.__module__ == name and 'forward' in vars(obj)
                    and not vars(obj).get('_mmvitswin_fp32', False)):
                for attr, wrap in (('forward', _fp32_forward), ('backward', _fp32_backward)):
                    fn = vars(obj).get(attr)
                    if fn is not None:
                        fn = fn.__func__ if isinstance(fn, staticmethod) else fn
                        setattr(obj, attr, staticmethod(wrap(fn)))
                obj._mmvitswin_fp32 = True
                wrapped += 1
    return wrapped


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """bf16 mixed precision on CPU: ``optim_context`` adds ``torch.autocast('cpu', bf16)``.

    MMEngine's ``BaseModel.train_step`` runs the data preprocessor and the loss inside
    ``optim_context`` and calls ``update_params`` (backward, step) after it, so the backward
    runs outside autocast, as the AMP recipe requires. Parameters, gradients and optimizer
    state stay fp32; no loss scaling. mmcv's ops run in fp32 inside it
(:func:`mmcv_ops_accept_bf16_on_cpu`). Other arguments: ``OptimWrapper``'s.
    """

    def __init__(self, dtype: str = 'bfloat16', **kwargs):
        super().__init__(**kwargs)
        if amp_dtype_name(dtype) != 'bf16':
            raise ValueError('CPUAmpOptimWrapper runs bf16 only (fp16 on CPU needs loss scaling '
                             'and has no fast kernels); use AmpOptimWrapper on CUDA for fp16')
        self.cast_dtype = torch.bfloat16
        mmcv_ops_accept_bf16_on_cpu()
        MMLogger.get_current_instance().info(
            'CPUAmpOptimWrapper: precision bf16 (forward under torch.autocast("cpu", '
            'torch.bfloat16); backward, gradients and optimizer step in fp32; no loss scaling)')

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        param = next(model.parameters(), None)
        if param is not None and param.device.type != 'cpu':
            raise RuntimeError(f'CPUAmpOptimWrapper autocasts on CPU but the model is on '
                               f'{param.device}; use AmpOptimWrapper there')
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield


def _upcast(obj: Any) -> Any:
    """Low-precision floating tensors in (nested) outputs back to fp32: metrics call
    ``.numpy()``, which has no bf16."""
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in (torch.bfloat16, torch.float16) else obj
    if isinstance(obj, BaseDataElement):
        for key, value in list(obj.items()):
            obj.set_field(_upcast(value), key, field_type=(
                'metainfo' if key in obj.metainfo_keys() else 'data'))
        return obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_upcast(v) for v in obj)
    if isinstance(obj, dict):
        return {k: _upcast(v) for k, v in obj.items()}
    return obj


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
            mmcv_ops_accept_bf16_on_cpu()
        MMLogger.get_current_instance().info(
            f'AmpTestLoop: precision {amp_dtype_name(dtype)} (test_step under torch.autocast('
            f'"{self.device_type}", {self.cast_dtype}); outputs evaluated in fp32)')

    @torch.no_grad()
    def run_iter(self, idx, data_batch) -> None:
        self.runner.call_hook('before_test_iter', batch_idx=idx, data_batch=data_batch)
        with torch.autocast(self.device_type, dtype=self.cast_dtype):
            outputs = self.runner.model.test_step(data_batch)
        outputs = _upcast(outputs)
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

"""Every torch-version-specific API that mmvitswin uses, in one place.

mmvitswin supports torch 2.1 to 2.13 (README, "Tested versions"). Code elsewhere in the package
imports from here instead of probing ``torch`` itself, so that importing :mod:`mmvitswin` never
raises ``AttributeError`` on an old torch and each fallback is written (and tested) once.

What degrades on an older torch:

* **Safe checkpoint loading** (``HAS_SAFE_GLOBAL_ALIASES``, torch >= 2.6). The weights-only
  unpickler with our runner-checkpoint allow-list needs ``add_safe_globals`` with
  ``(object, "module.name")`` entries (torch 2.6). Before that, :mod:`mmvitswin.core.checkpoint.
  files` loads checkpoints the way MMEngine itself does on that torch: ``torch.load`` with
  ``weights_only=False``, i.e. full pickle, which can run code embedded in the file. Only load
  checkpoints you trust there (the same as with plain MMEngine/MMDetection on that torch).
* **Loss scaling**: :func:`grad_scaler` (``torch.amp.GradScaler``, torch 2.3) falls back to
  the CUDA one. fp16 autocast on CPU (``CPU_AUTOCAST_FP16``) is missing on torch 2.1 (bf16
  only): :func:`autocast` says so, and the fp16-on-CPU tests skip.
* **Autocast queries** (:func:`is_autocast_enabled`, :func:`get_autocast_dtype`) use the
  per-device spellings of torch < 2.4. Same answers; under torch.compile on torch 2.1,
  :func:`get_autocast_dtype` is a graph break (dynamo cannot trace the old spelling).
* **torch.compile with dynamic shapes** (``COMPILE_DYNAMIC_OK``, torch >= 2.6): before that,
  ``torch.compile(dynamic=True, fullgraph=True)`` of a Swin backbone (pad to window, roll,
  window partition with symbolic sizes) hits dynamic-shape bugs reported against Swin models
  through torch 2.5 (pytorch#121637, #128134, #139474) and fails on torch 2.1 here; callers
  (benchmarks, tests) skip or compile with static shapes instead.
* **Export** (``HAS_TORCH_EXPORT``, torch >= 2.2: ``torch.export.export`` with
  ``torch.export.Dim`` dynamic shapes; ``HAS_DYNAMO_ONNX_EXPORT``, torch >= 2.5:
  ``torch.onnx.export(..., dynamo=True)``): unavailable features; their tests skip.
* **Guard-free size comparison while tracing** (:func:`statically_known_true`): where torch's
  ``symbolic_shapes`` lacks it, every symbolic comparison reads as unknown (False), so the
  window helpers take their arithmetic path (same shapes, longer expressions to trace).
* ``F.scaled_dot_product_attention(..., scale=)`` exists from torch 2.1, our floor, so attention
  needs no fallback (``SDPA_HAS_SCALE`` records it). :func:`sdpa_without_cudnn` (leave cuDNN's
  attention backend out) is a no-op context where torch has no cuDNN backend to leave out
  (before 2.4) or no ``torch.nn.attention.sdpa_kernel`` (before 2.3).
"""
import contextlib
import re
import warnings
from typing import Callable, Iterable, List, Optional, Tuple

import torch


def _parse_version(text: str) -> Tuple[int, int, int]:
    """``'2.1.2+cu121'`` -> ``(2, 1, 2)``; ``'2.13.0a0+git1234'`` -> ``(2, 13, 0)``."""
    parts = [int(p) for p in re.findall(r'\d+', text.split('+')[0])[:3]]
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)  # type: ignore[return-value]


TORCH_VERSION: Tuple[int, int, int] = _parse_version(torch.__version__)

_serialization = torch.serialization
# torch.serialization.add_safe_globals (2.4) ...
HAS_SAFE_GLOBALS: bool = hasattr(_serialization, 'add_safe_globals')
# ... accepting (obj, 'module.name') entries, which our allow-list needs (2.6, pytorch#142153).
HAS_SAFE_GLOBAL_ALIASES: bool = HAS_SAFE_GLOBALS and TORCH_VERSION >= (2, 6)
# torch.serialization.get_unsafe_globals_in_checkpoint (2.5).
HAS_UNSAFE_GLOBALS_SCAN: bool = hasattr(_serialization, 'get_unsafe_globals_in_checkpoint')
# torch.load's default for weights_only: True from 2.6, False before.
WEIGHTS_ONLY_DEFAULT: bool = TORCH_VERSION >= (2, 6)

SDPA_HAS_SCALE: bool = TORCH_VERSION >= (2, 1)
COMPILE_DYNAMIC_OK: bool = hasattr(torch, 'compile') and TORCH_VERSION >= (2, 6)
HAS_TORCH_EXPORT: bool = TORCH_VERSION >= (2, 2)
HAS_DYNAMO_ONNX_EXPORT: bool = TORCH_VERSION >= (2, 5)


def torch_at_least(*version: int) -> bool:
    """``torch_at_least(2, 5)``: is the installed torch at least that version?"""
    return TORCH_VERSION >= tuple(version) + (0,) * (3 - len(version))


# ----------------------------------------------------------------------------- serialization
def add_safe_globals(entries: Iterable) -> bool:
    """``torch.serialization.add_safe_globals(entries)`` where the allow-list supports them.

    Returns False (and does nothing) on torch < 2.6, where there is no allow-list or it rejects
    ``(obj, name)`` entries; torch.load does not default to weights-only there anyway.
    """
    if not HAS_SAFE_GLOBAL_ALIASES:
        return False
    _serialization.add_safe_globals(list(entries))
    return True


def safe_globals(entries: Iterable):
    """A context in which weights-only ``torch.load`` also accepts ``entries`` (torch's
    ``serialization.safe_globals``; the process-wide allow-list is restored on exit). A null
    context on torch < 2.6, which does not default to weights-only."""
    if not HAS_SAFE_GLOBAL_ALIASES:
        return contextlib.nullcontext()
    return _serialization.safe_globals(list(entries))


def unsafe_globals_in_checkpoint(file: str) -> Optional[List[str]]:
    """Names of the non-default globals a zip checkpoint's pickle refers to; None where torch
    cannot scan (torch < 2.5). Raises like torch for files that are not zip checkpoints."""
    if not HAS_UNSAFE_GLOBALS_SCAN:
        return None
    return list(_serialization.get_unsafe_globals_in_checkpoint(file))


# ---------------------------------------------------------------------------------- autocast
# Every probe below is looked up once, here: the query functions are called inside model forwards
# that torch.compile traces, and dynamo before 2.3 cannot trace getattr(module, name, default).
if TORCH_VERSION >= (2, 4):

    def is_autocast_enabled(device_type: str = 'cuda') -> bool:
        """Is autocast on for ``device_type`` in this thread? (False on the ``meta`` device,
        which autocast does not know.)"""
        return device_type != 'meta' and torch.is_autocast_enabled(device_type)

    def get_autocast_dtype(device_type: str = 'cuda') -> torch.dtype:
        """The dtype autocast uses (or would use) on ``device_type``."""
        return torch.get_autocast_dtype(device_type)

else:
    # torch < 2.4 spells the queries per device: is_autocast_cpu_enabled, get_autocast_gpu_dtype
    _OLD_AUTOCAST_QUERIES = {
        'cpu': (torch.is_autocast_cpu_enabled, torch.get_autocast_cpu_dtype),
        'cuda': (torch.is_autocast_enabled, torch.get_autocast_gpu_dtype),
    }
    for _device in ('xpu', 'hpu', 'ipu', 'xla'):
        _queries = (getattr(torch, f'is_autocast_{_device}_enabled', None),
                    getattr(torch, f'get_autocast_{_device}_dtype', None))
        if None not in _queries:
            _OLD_AUTOCAST_QUERIES[_device] = _queries

    def _old_autocast_queries(device_type: str):
        if device_type not in _OLD_AUTOCAST_QUERIES:
            raise ValueError(
                f'torch {torch.__version__} cannot query autocast for {device_type!r}')
        return _OLD_AUTOCAST_QUERIES[device_type]

    def is_autocast_enabled(device_type: str = 'cuda') -> bool:
        """Is autocast on for ``device_type`` in this thread? (False for a device this torch
        cannot autocast.)"""
        if device_type not in _OLD_AUTOCAST_QUERIES:
            return False
        return _OLD_AUTOCAST_QUERIES[device_type][0]()

    def get_autocast_dtype(device_type: str = 'cuda') -> torch.dtype:
        """The dtype autocast uses (or would use) on ``device_type``."""
        return _old_autocast_queries(device_type)[1]()


def _cpu_autocast_accepts(dtype: torch.dtype) -> bool:
    """Probe once: can CPU autocast run in ``dtype``? (torch 2.1: bf16 only.)"""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # old torch warns 'Disabling autocast' before raising
        try:
            with torch.autocast('cpu', dtype=dtype):
                return is_autocast_enabled('cpu')
        except RuntimeError:
            return False


# fp16 autocast on CPU (torch 2.1 has bf16 only; measured by entering it, not by version)
CPU_AUTOCAST_FP16: bool = _cpu_autocast_accepts(torch.float16)


def autocast(device_type: str, dtype: Optional[torch.dtype] = None, enabled: bool = True):
    """``torch.autocast`` that behaves the same on every torch.

    ``enabled=False`` disables autocast whatever ``dtype`` says (torch 2.1 raises for a disabled
    CPU autocast given ``dtype=torch.float32``). fp16 on CPU where this torch cannot
    (``CPU_AUTOCAST_FP16`` False) raises ``RuntimeError`` with the reason instead of torch 2.1's
    warning followed by an unrelated error.
    """
    if not enabled:
        return torch.autocast(device_type, enabled=False)
    if device_type == 'cpu' and dtype == torch.float16 and not CPU_AUTOCAST_FP16:
        raise RuntimeError(f'torch {torch.__version__} cannot autocast to float16 on CPU '
                           '(bfloat16 only); use bf16 or a newer torch')
    return torch.autocast(device_type, dtype=dtype)


LOW_PRECISION: Tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)


def autocast_off(device_type: str):
    """A context that turns autocast off for ``device_type`` where it is on (a null context
    elsewhere, the ``meta`` device included): for parts that must run in their inputs'
    precision."""
    if is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def cast_floats(value, dtype: torch.dtype, only: Optional[Tuple[torch.dtype, ...]] = None):
    """``value`` with every floating-point tensor inside (tuples, lists, dicts) cast to
    ``dtype``; with ``only``, just the tensors whose dtype is in ``only`` (e.g.
    ``only=LOW_PRECISION`` brings bf16/fp16 outputs back to fp32 and leaves the rest).

    The one recursive tensor caster of mmvitswin (the AMP engine's)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and (only is None or value.dtype in only):
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floats(v, dtype, only) for v in value)
    if isinstance(value, dict):
        return {k: cast_floats(v, dtype, only) for k, v in value.items()}
    return value


def grad_scaler(device_type: str = 'cuda', **kwargs):
    """A loss scaler for fp16 on ``device_type``: ``torch.amp.GradScaler`` (torch >= 2.3), else
    ``torch.cuda.amp.GradScaler`` for CUDA; torch < 2.3 has none for other devices (it has no
    fp16 autocast on CPU either), so that raises ``RuntimeError``."""
    scaler = getattr(torch.amp, 'GradScaler', None)
    if scaler is not None:
        return scaler(device_type, **kwargs)
    if device_type == 'cuda':
        return torch.cuda.amp.GradScaler(**kwargs)
    raise RuntimeError(f'torch {torch.__version__} has no GradScaler for {device_type!r} '
                       '(fp16 loss scaling there needs torch >= 2.3)')


# ---------------------------------------------------------------------------------- attention
def _sdpa_backends_without_cudnn() -> Optional[list]:
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:  # torch < 2.3
        return None
    if not hasattr(SDPBackend, 'CUDNN_ATTENTION'):  # torch < 2.4: nothing to leave out
        return None
    return [b for b in (getattr(SDPBackend, n, None) for n in (
        'FLASH_ATTENTION', 'EFFICIENT_ATTENTION', 'MATH', 'OVERRIDEABLE')) if b is not None]


_NO_CUDNN_SDPA = _sdpa_backends_without_cudnn()


def sdpa_without_cudnn():
    """A context in which ``F.scaled_dot_product_attention`` may pick any of its backends but
    cuDNN's (``torch.nn.attention.sdpa_kernel``, restored on exit). A no-op context on a torch
    without that backend."""
    if _NO_CUDNN_SDPA is None:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel
    return sdpa_kernel(_NO_CUDNN_SDPA)


# ------------------------------------------------------------------------ compile and export
def _is_compiling_probe() -> Optional[Callable[[], bool]]:
    probe = getattr(getattr(torch, 'compiler', None), 'is_compiling', None)  # torch >= 2.3
    if probe is None:
        try:
            from torch._dynamo import is_compiling as probe  # dynamo folds it to True
        except ImportError:  # pragma: no cover - a torch built without dynamo
            probe = None
    return probe


def _export_probes() -> Tuple[Callable[[], bool], ...]:
    # ``torch.onnx.is_in_onnx_export`` is not asked: both ONNX exporters run the model under one
    # of these (the TorchScript-based one under jit tracing, the dynamo-based one under
    # torch.export / dynamo; tests/test_compat.py checks it), and it costs more than the
    # others together (it imports two modules on every call; ~1 us, asked hundreds of times
    # per forward)
    probes = [getattr(getattr(torch, 'compiler', None), 'is_exporting', None),  # torch.export
              torch.jit.is_tracing]
    return tuple(p for p in probes if p is not None)


_IS_COMPILING = _is_compiling_probe()
_EXPORT_PROBES = _export_probes()
_TRACING_PROBES = ((_IS_COMPILING, ) if _IS_COMPILING is not None else ()) + _EXPORT_PROBES + (
    torch.jit.is_scripting, )


def is_compiling() -> bool:
    """True while torch.compile (dynamo) traces the calling code."""
    return _IS_COMPILING is not None and bool(_IS_COMPILING())


def is_exporting() -> bool:
    """True while the calling code is being exported or traced to a graph: torch.export (where
    ``torch.compiler.is_exporting`` exists; older torch.export is only seen by
    :func:`is_compiling`), ``torch.onnx.export`` (either exporter) or ``torch.jit.trace``."""
    for probe in _EXPORT_PROBES:
        if probe():
            return True
    return False


def is_tracing() -> bool:
    """:func:`is_compiling`, :func:`is_exporting` or TorchScript scripting, as one flat loop:
    the layers ask it hundreds of times per forward, and each nested call costs the host time
    a GPU then waits for."""
    for probe in _TRACING_PROBES:
        if probe():
            return True
    return False


def statically_known_true(condition) -> bool:
    """Whether ``condition`` (a bool, or a symbolic one while tracing) is provably True,
    decided without adding a guard (torch's ``symbolic_shapes.statically_known_true``); False
    where this torch has no such function. Imported on first use: that module loads sympy."""
    from torch.fx.experimental import symbolic_shapes
    known = getattr(symbolic_shapes, 'statically_known_true', None)
    return known is not None and known(condition)


__all__ = [
    'TORCH_VERSION', 'HAS_SAFE_GLOBALS', 'HAS_SAFE_GLOBAL_ALIASES', 'HAS_UNSAFE_GLOBALS_SCAN',
    'WEIGHTS_ONLY_DEFAULT', 'SDPA_HAS_SCALE', 'COMPILE_DYNAMIC_OK', 'HAS_TORCH_EXPORT',
    'HAS_DYNAMO_ONNX_EXPORT', 'torch_at_least', 'add_safe_globals',
    'unsafe_globals_in_checkpoint', 'is_autocast_enabled', 'get_autocast_dtype',
    'CPU_AUTOCAST_FP16', 'autocast', 'autocast_off', 'LOW_PRECISION', 'cast_floats',
    'grad_scaler', 'is_compiling', 'is_exporting', 'is_tracing', 'statically_known_true'
]

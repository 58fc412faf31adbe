"""Measurement primitives for ``tools/benchmark.py``: wall time, peak memory, FLOPs, GEMM peak
and a description of the machine.

This module knows nothing about models or references; the tool pairs our backbones with
mmdet's/mmseg's and decides what to run. Everything here is usable on its own, e.g.::

    mem = measure_peak_memory(lambda: model(x), torch.device('cpu'))
    mem.peak_bytes  # peak resident-set increase of that one call

Peak memory on CPU is the peak *resident set* increase of one call over the RSS just before
it. Linux lets a process reset its own high-water mark (``/proc/self/clear_refs`` with ``5``,
Linux >= 4.0) and reads it back as ``VmHWM``; this avoids ``ru_maxrss``, which is a
process-lifetime maximum and cannot tell two measurements in one process apart. Freed heap
memory is first returned to the OS (``malloc_trim``) so memory that a previous call left in
glibc's free lists does not hide this call's growth. On CUDA it is
``torch.cuda.max_memory_allocated`` over ``memory_allocated`` after a reset of the peak stats.
"""
import ctypes
import ctypes.util
import gc
import os
import platform
import re
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, List, Optional, Sequence

import torch

DTYPES: Dict[str, torch.dtype] = {
    'fp32': torch.float32,
    'bf16': torch.bfloat16,
    'fp16': torch.float16,
}


# ------------------------------------------------------------------------------ small helpers
def parse_dtype(name: str) -> torch.dtype:
    """'fp32' | 'bf16' | 'fp16' -> torch dtype."""
    if name not in DTYPES:
        raise ValueError(f'dtype must be one of {sorted(DTYPES)}, got {name!r}')
    return DTYPES[name]


def autocast_context(device: torch.device, dtype_name: str) -> ContextManager:
    """``torch.autocast`` for bf16/fp16; a no-op for fp32 (the models' own precision)."""
    dtype = parse_dtype(dtype_name)
    if dtype is torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (CUDA kernels are asynchronous); no-op on CPU."""
    if device.type == 'cuda' and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def median(values: Sequence[float]) -> Optional[float]:
    """Median, or None for an empty sequence (e.g. ``--runs 0``)."""
    return float(statistics.median(values)) if len(values) else None


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one ``fn()`` takes, with the device synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


# ------------------------------------------------------------------------------ peak memory
def _status_kib(field: str) -> Optional[int]:
    """A ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``), or None off Linux."""
    try:
        with open('/proc/self/status') as f:
            text = f.read()
    except OSError:
        return None
    found = re.search(rf'^{field}:\s+(\d+)\s+kB', text, re.MULTILINE)
    return int(found.group(1)) if found else None


def _write_clear_refs_5() -> bool:
    """Ask the kernel to reset this process's VmHWM to its current RSS; False if refused."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return False
    return True


_HWM_RESET_WORKS: Optional[bool] = None


def _hwm_reset_works() -> bool:
    """Whether writing ``5`` to clear_refs really lowers VmHWM here, decided once per process.

    A kernel without the ``5`` command accepts the write and changes nothing, and a container
    may refuse it. The test is an experiment with a margin far above the kernel's RSS counter
    slack (per-CPU counters are approximate by a few hundred KiB): make 32 MiB resident, free
    it, reset, and the high-water mark must have dropped by at least half of that.
    """
    global _HWM_RESET_WORKS
    if _HWM_RESET_WORKS is None:
        size = 32 * 2**20
        block = torch.ones(size // 4)  # touched, so resident
        float(block[-1])
        high = _status_kib('VmHWM')
        del block
        gc.collect()
        _malloc_trim()
        ok = high is not None and _write_clear_refs_5()
        after = _status_kib('VmHWM') if ok else None
        _HWM_RESET_WORKS = bool(ok and after is not None and after <= high - size // 2048)
    return _HWM_RESET_WORKS


_LIBC = None


def _malloc_trim() -> None:
    """Give glibc's free heap pages back to the OS (no-op without glibc)."""
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library('c')
        try:
            _LIBC = ctypes.CDLL(name) if name else False
        except OSError:
            _LIBC = False
    if _LIBC and hasattr(_LIBC, 'malloc_trim'):
        _LIBC.malloc_trim(0)


def cpu_memory_method() -> str:
    """How :func:`measure_peak_memory` measures CPU memory on this machine."""
    return 'rss-hwm' if _hwm_reset_works() else 'unavailable'


@dataclass
class PeakMemory:
    """Result of :func:`measure_peak_memory`: the peak increase during the call in bytes
    (None if it cannot be measured here) and how it was measured."""
    peak_bytes: Optional[int]
    method: str
    baseline_bytes: Optional[int] = None


def measure_peak_memory(fn: Callable[[], object], device: torch.device) -> PeakMemory:
    """Run ``fn()`` once and return its peak memory increase over the state just before it.

    CPU: peak RSS (VmHWM after a reset) minus the RSS before the call, after ``gc`` and
    ``malloc_trim``. CUDA: ``max_memory_allocated - memory_allocated`` after a peak reset
    (tensor memory only, not the caching allocator's reserve).
    """
    gc.collect()
    if device.type == 'cuda':
        if not torch.cuda.is_available():
            raise RuntimeError('device is cuda but torch.cuda.is_available() is False')
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        return PeakMemory(peak - before, 'cuda-max-allocated', before)
    if not _hwm_reset_works():
        fn()
        return PeakMemory(None, 'unavailable')
    _malloc_trim()
    _write_clear_refs_5()
    before = _status_kib('VmRSS')
    fn()
    peak = max(_status_kib('VmHWM'), _status_kib('VmRSS'))
    return PeakMemory(max(0, peak - before) * 1024, 'rss-hwm', before * 1024)


# ----------------------------------------------------------------------------------- FLOPs
def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs (a multiply-add counts 2) of the matmuls/convolutions/attention ``fn()`` runs,
    counted by ``torch.utils.flop_counter.FlopCounterMode`` (elementwise ops count 0)."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def gemm_peak(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 2048,
              runs: int = 5, warmup: int = 1) -> dict:
    """Achievable GEMM throughput: median GFLOP/s of ``torch.mm`` on two ``n x n`` matrices
    (``2 n^3`` FLOPs), with the current thread count. The yardstick for a model's GFLOP/s."""
    if n < 1 or runs < 1 or warmup < 0:
        raise ValueError(f'gemm_peak needs n >= 1, runs >= 1, warmup >= 0; got n={n}, '
                         f'runs={runs}, warmup={warmup}')
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    for _ in range(warmup):
        torch.mm(a, b)
    times = [time_call(lambda: torch.mm(a, b), device) for _ in range(runs)]
    flops = 2 * n**3
    return dict(n=n, dtype=str(dtype).replace('torch.', ''), flops=flops, times_s=times,
                median_s=median(times), gflops=flops / median(times) / 1e9)


# ----------------------------------------------------------------------------- the machine
def _cpu_model() -> str:
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.lower().startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict:
    """CPU model, core counts, load, library versions, threads and (on CUDA) the GPU."""
    info = dict(
        cpu_model=_cpu_model(),
        cpu_count=os.cpu_count(),
        cpu_affinity=len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else None,
        load_average=list(os.getloadavg()) if hasattr(os, 'getloadavg') else None,
        platform=platform.platform(),
        python=platform.python_version(),
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        torch_interop_threads=torch.get_num_interop_threads(),
        device=str(device),
        cpu_memory_method=cpu_memory_method() if device.type == 'cpu' else None,
        # these cap torch's default thread count; a shared machine may set them
        thread_env={k: os.environ.get(k) for k in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')},
    )
    for name in ('mmengine', 'mmcv', 'mmdet', 'mmseg'):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # an absent or broken host is a fact to report, not an error
            info[name] = None
    if device.type == 'cuda' and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                    cuda=torch.version.cuda)
    return info


def summarize(times: List[float]) -> dict:
    """The raw times and their median/min/max (seconds)."""
    return dict(times_s=list(times), median_s=median(times),
                min_s=min(times) if times else None, max_s=max(times) if times else None)

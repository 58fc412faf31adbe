"""The one switch between the plain path and the special fast path of the layers.

Every layer's default path is plain PyTorch (``F.linear``, ``F.gelu``,
``F.scaled_dot_product_attention``, indexing and reshapes), so autocast, CUDA, ``torch.compile``,
``torch.export`` and ONNX see ordinary ops. A special path (a custom autograd function) may be
taken only where :func:`fast_path_active` says so: the switch is on, every tensor is on the CPU,
no autocast is active, and nothing is being traced (dynamo/compile, export, ONNX, TorchScript).

What sits behind it: the FFN's recomputed-GELU backward (``layers.ffn``), which keeps a
quarter less activation memory per transformer block in fp32 CPU training, and the fp32 linear
layers through oneDNN in row chunks from a fixed ladder of sizes (``layers.linear``: a bounded
set of kernels whatever the input sizes), forward and backward, with the FFN's two layers run
chunk by chunk in inference.

By default (``auto``) the switch is on only on CPUs where the fast path measured faster: AMD's
and Hygon's x86 CPUs without AVX-512 (torch's CPU capability ``AVX2``). There PyTorch's fp32
GEMM (MKL) runs the transformer's thin layers at about half oneDNN's speed (Swin-T fp32 train
step 1.30-1.35x mmdet's with the fast path against 1.04x without, 2-core AMD EPYC with AVX2).
On Intel CPUs MKL is as fast, and the plain path measured faster (train step 1.07x mmdet's
against 0.69x with the fast path, 2-core Xeon with AMX); on AMD's Zen 4 (AVX-512) the fast
path made the fp32 forward and train step 2-15 % slower than the plain ops (0.85-0.98x,
``tools/benchmark.py`` variants ``' fast'`` against ``' plain'``, a new size per call). On
AMD's Zen 5 (CPU family 26 and later: full-width AVX-512) MKL's fp32 GEMM ran at 164-184
GFLOP/s on 2 cores and oneDNN at 268-411, and the fast path made inference 10-37 % faster
(Swin-T forward 1.14x, SwinV2-T 1.10-1.12x, DINOv2-B simple pyramid 1.32-1.37x) while the
train step came out between 14 % slower and 5 % faster: there ``auto`` takes it for inference
(no autograd) only.
``set_fast_path(True/False)`` (or ``MMVITSWIN_FAST_PATH=1`` / ``0`` in the environment) forces
it on or off; ``set_fast_path(None)`` (``auto``) goes back to the default.
"""
import os
import platform
from typing import Optional

import torch

# is_tracing: True while dynamo/``torch.compile``, ``torch.export``, the ONNX exporter or
# TorchScript tracing runs the model (shape-dependent Python branches must then be avoided);
# the layers import it from here
from ..compat import is_autocast_enabled, is_tracing  # noqa: F401

_MODES = {'1': True, 'true': True, 'on': True, '0': False, 'false': False, 'off': False,
          'auto': None, '': None}
_setting = os.environ.get('MMVITSWIN_FAST_PATH', 'auto').strip().lower()
if _setting not in _MODES:
    raise ValueError(f'MMVITSWIN_FAST_PATH must be one of 1, 0, auto (or on/off/true/false), '
                     f'got {_setting!r}')
_enabled: Optional[bool] = _MODES[_setting]
_vendor: Optional[str] = None
_family: Optional[int] = None


def eager_autograd(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether autograd records an op on ``tensors`` (None entries skipped) in an eager call:
    grad mode on, one of them requires grad, nothing traced. Where the layers take their
    autograd functions with a written-out backward; traced graphs keep the plain ops, which
    compile and export differentiate or export as they are."""
    return (torch.is_grad_enabled() and not is_tracing()
            and any(t is not None and t.requires_grad for t in tensors))


def _cpuinfo_field(name: str) -> Optional[str]:
    """The value of the first ``name : value`` line of /proc/cpuinfo; None where the file
    cannot be read (not Linux) or has no such line."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith(name):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_vendor() -> str:
    """The CPU's vendor string (x86: ``GenuineIntel``, ``AuthenticAMD``, ...), '' if unknown."""
    global _vendor
    if _vendor is None:
        _vendor = _cpuinfo_field('vendor_id')
        if _vendor is None:  # not Linux: Windows names the vendor in the processor string
            found = [v for v in ('GenuineIntel', 'AuthenticAMD', 'HygonGenuine')
                     if v in platform.processor()]
            _vendor = found[0] if found else ''
    return _vendor


def cpu_family() -> int:
    """The x86 CPU family (``cpu family`` in /proc/cpuinfo: 25 for AMD's Zen 3/4, 26 for Zen
    5), 0 if unknown."""
    global _family
    if _family is None:
        value = _cpuinfo_field('cpu family')
        _family = int(value) if value is not None and value.isdigit() else 0
    return _family


def denormals_are_slow(device: torch.device) -> bool:
    """Whether arithmetic on denormal floats costs extra on ``device``: on Intel's x86 CPUs
    (microcode assists: softmax, its backward and the product with v 4-35x slower on a 2-core
    Xeon, family 6 model 207), not on AMD's Zen 4 (no measurable penalty there, so dropping
    the denormals first is pure extra work) nor on GPUs. ``layers.attention`` drops negligible
    masked logits only where this is True (docs/benchmarks.md, "Denormal attention weights")."""
    return torch.device(device).type == 'cpu' and cpu_vendor() == 'GenuineIntel'


def cpu_capability() -> str:
    """The vector ISA torch's CPU kernels were dispatched for here (``'AVX512'``, ``'AVX2'``,
    ...; torch.backends.cpu.get_cpu_capability), '' where this torch cannot say."""
    get = getattr(getattr(torch.backends, 'cpu', None), 'get_cpu_capability', None)
    return get() if get is not None else ''


def fast_path_pays_here(autograd: bool = True) -> bool:
    """What ``auto`` decides, with or without ``autograd`` (module doc): True on x86 CPUs of
    AMD and Hygon without AVX-512; on AMD's Zen 5 and later, only without autograd."""
    vendor, avx512 = cpu_vendor(), cpu_capability().startswith('AVX512')
    if vendor in ('AuthenticAMD', 'HygonGenuine') and not avx512:
        return True
    return vendor == 'AuthenticAMD' and avx512 and cpu_family() >= 26 and not autograd


def fast_path_setting() -> str:
    """``'on'``/``'off'`` as forced, or ``'auto (on)'``/``'auto (inference)'``/``'auto
    (off)'`` as decided here."""
    if _enabled is not None:
        return 'on' if _enabled else 'off'
    if fast_path_pays_here(autograd=True):
        return 'auto (on)'
    return 'auto (inference)' if fast_path_pays_here(autograd=False) else 'auto (off)'


def set_fast_path(enabled: Optional[bool]) -> Optional[bool]:
    """Force the special fast path on (True) or off (False), or let this CPU decide (None);
    returns the previous setting."""
    global _enabled
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f'enabled must be True, False or None (auto), got {enabled!r}')
    previous = _enabled
    _enabled = enabled
    return previous


def fast_path_active(*tensors: torch.Tensor) -> bool:
    """Whether a layer may take its special path for these tensors (see the module doc)."""
    if is_tracing() or not (fast_path_pays_here(torch.is_grad_enabled()) if _enabled is None
                            else _enabled):
        return False
    if any(t.device.type != 'cpu' for t in tensors):
        return False
    return not (is_autocast_enabled('cpu') or is_autocast_enabled('cuda'))


# Read the vendor and family now, not in the first forward: a forward that torch.compile
# traces must not open a file (a graph break where the attention asks ``denormals_are_slow``).
cpu_vendor()
cpu_family()

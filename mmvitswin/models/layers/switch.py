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
chunk by chunk in inference. ``set_fast_path(False)`` (or ``MMVITSWIN_FAST_PATH=0`` in the
environment) turns all of it off.
"""
import os

import torch

from ...compat import is_autocast_enabled, is_compiling, is_exporting

_enabled = os.environ.get('MMVITSWIN_FAST_PATH', '1') not in ('0', 'false', 'False', '')


def set_fast_path(enabled: bool) -> bool:
    """Turn the special fast path on or off; returns the previous state."""
    global _enabled
    previous = _enabled
    _enabled = bool(enabled)
    return previous


def is_tracing() -> bool:
    """True while dynamo/``torch.compile``, ``torch.export``, the ONNX exporter or TorchScript
    tracing runs the model: shape-dependent Python branches must then be avoided."""
    return is_compiling() or is_exporting() or torch.jit.is_scripting()


def fast_path_active(*tensors: torch.Tensor) -> bool:
    """Whether a layer may take its special path for these tensors (see the module doc)."""
    if not _enabled or is_tracing():
        return False
    if any(t.device.type != 'cpu' for t in tensors):
        return False
    return not (is_autocast_enabled('cpu') or is_autocast_enabled('cuda'))

"""``Linear``: ``nn.Linear`` whose fp32 CPU product may take the fast path (``layers.switch``).

Why: on some CPUs (measured on AMD EPYC, torch 2.13) PyTorch's ``F.linear`` (MKL's sgemm) runs
the thin matrices of a vision transformer (K or N of 96-1536) at about half the speed of
oneDNN. A 1x1 ``F.conv2d`` on a channels-last view is the same product and PyTorch hands it to
oneDNN when it runs on more than one thread. oneDNN builds and keeps a kernel ("primitive")
for every input shape it sees, so feeding it each new image size would grow memory without
bound (measured: 1 GiB over 600 shapes). The fast path therefore cuts the rows into chunks of
a fixed ``CHUNK_ROWS`` rows: one primitive per (in, out) feature pair and direction, a fixed
number per model whatever the input sizes; the remaining rows go through ``F.linear``.

Taken only where :func:`~.switch.fast_path_active` allows (CPU, no autocast, not traced), for
fp32, with more than one thread, and when there is at least one full chunk. Same numbers as
``F.linear`` up to float rounding; gradients flow through the convolution as usual.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .switch import fast_path_active

CHUNK_ROWS = 512


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through fixed-size oneDNN chunks where the switch allows."""
    # the switch first: while tracing, the row count below is symbolic and must not be compared
    if not fast_path_active(x, weight):
        return F.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (rows < CHUNK_ROWS or x.dtype != torch.float32 or weight.dtype != torch.float32
            or torch.get_num_threads() < 2):
        return F.linear(x, weight, bias)
    k = x.shape[-1]
    flat = x.reshape(rows, k)
    full = rows // CHUNK_ROWS * CHUNK_ROWS
    kernel = weight[:, :, None, None]
    parts = []
    for start in range(0, full, CHUNK_ROWS):
        chunk = flat[start:start + CHUNK_ROWS].view(1, CHUNK_ROWS, 1, k).permute(0, 3, 1, 2)
        parts.append(F.conv2d(chunk, kernel, bias).permute(0, 2, 3, 1).reshape(CHUNK_ROWS, -1))
    if full < rows:
        parts.append(F.linear(flat[full:], weight, bias))
    out = torch.cat(parts) if len(parts) > 1 else parts[0]
    return out.view(*x.shape[:-1], weight.shape[0])


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict keys) that calls :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

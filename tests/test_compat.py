"""mmvitswin.core.compat: one answer per torch version, same behaviour on every supported torch."""
import importlib
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import requires_torch

from mmvitswin.core import compat


@pytest.mark.parametrize('text, expected', [
    ('2.1.2', (2, 1, 2)), ('2.1.2+cu121', (2, 1, 2)), ('2.13.0+cpu', (2, 13, 0)),
    ('2.6.0a0+git1234abc', (2, 6, 0)), ('2.4', (2, 4, 0)), ('2.10.1.post3', (2, 10, 1))])
def test_parse_version(text, expected):
    assert compat._parse_version(text) == expected


def test_torch_version_and_flags_match_installed_torch():
    major, minor = (int(p) for p in torch.__version__.split('.')[:2])
    assert compat.TORCH_VERSION[:2] == (major, minor)
    assert compat.torch_at_least(major, minor) and not compat.torch_at_least(major, minor + 1)
    ser = torch.serialization
    assert compat.HAS_SAFE_GLOBALS == hasattr(ser, 'add_safe_globals')
    assert compat.HAS_UNSAFE_GLOBALS_SCAN == hasattr(ser, 'get_unsafe_globals_in_checkpoint')
    assert compat.HAS_SAFE_GLOBAL_ALIASES <= compat.HAS_SAFE_GLOBALS
    assert compat.WEIGHTS_ONLY_DEFAULT == compat.torch_at_least(2, 6)
    assert compat.HAS_DYNAMO_ONNX_EXPORT == compat.torch_at_least(2, 5)
    if compat.HAS_TORCH_EXPORT:
        export = importlib.import_module('torch.export')
        assert callable(export.export) and hasattr(export, 'Dim')


# Importing the package records every warning; a FutureWarning or DeprecationWarning that
# points into mmvitswin (the line that calls a deprecated API of the installed torch or host)
# fails. Warnings the hosts' own imports raise from their code (torch 2.1's Dynamo importing
# onnxscript, say) point into those packages: not ours to change.
IMPORT_PROBE = """
import json, os, warnings
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter('always')
    import mmvitswin, mmvitswin.core.compat as c
root = os.path.dirname(os.path.abspath(mmvitswin.__file__)) + os.sep
ours = ['%s: %s:%d: %s' % (w.category.__name__, w.filename, w.lineno, w.message) for w in seen
        if issubclass(w.category, (FutureWarning, DeprecationWarning))
        and os.path.abspath(w.filename).startswith(root)]
print(json.dumps(dict(version=str(c.TORCH_VERSION), ours=ours, total=len(seen))))
"""


@pytest.mark.slow(reason='a fresh interpreter')
def test_import_in_fresh_interpreter_has_no_version_errors():
    proc = subprocess.run([sys.executable, '-c', IMPORT_PROBE], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report['version'] == str(compat.TORCH_VERSION)
    assert report['ours'] == []


def test_import_probe_sees_a_deprecation_in_our_code():
    """The probe above does catch a FutureWarning raised at a line of the package."""
    import mmvitswin
    root = os.path.dirname(os.path.abspath(mmvitswin.__file__))
    code = IMPORT_PROBE.replace(
        "    import mmvitswin, mmvitswin.core.compat as c\n",
        "    import mmvitswin, mmvitswin.core.compat as c\n"
        "    exec(compile('import warnings; warnings.warn(\"old\", FutureWarning)', "
        f"{os.path.join(root, 'core', 'compat.py')!r}, 'exec'))\n")
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = json.loads(proc.stdout.strip().splitlines()[-1])['ours']
    assert len(ours) == 1 and 'FutureWarning' in ours[0] and 'old' in ours[0]


def test_autocast_queries_cpu():
    assert compat.is_autocast_enabled('cpu') is False
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert compat.is_autocast_enabled('cpu') is True
        assert compat.get_autocast_dtype('cpu') == torch.bfloat16
        with torch.autocast('cpu', enabled=False):
            assert compat.is_autocast_enabled('cpu') is False
    assert compat.is_autocast_enabled('cuda') is False  # answers even without a GPU


def test_is_compiling_false_in_eager_true_under_dynamo():
    assert compat.is_compiling() is False

    def f(x):
        return x + 1 if compat.is_compiling() else x - 1

    compiled = torch.compile(f, backend='eager', fullgraph=True)
    x = torch.zeros(3)
    assert torch.equal(f(x), -torch.ones(3))
    assert torch.equal(compiled(x), torch.ones(3))


def test_queries_trace_in_one_graph():
    """The queries run inside compiled model forwards: dynamo must trace them, no graph break."""

    def f(x):
        assert not compat.is_exporting()
        if compat.is_autocast_enabled('cpu'):
            return x * 0
        return x + 1 if compat.is_compiling() else x - 1

    compiled = torch.compile(f, backend='eager', fullgraph=True)
    assert torch.equal(compiled(torch.zeros(2)), torch.ones(2))


@requires_torch((2, 4), 'dynamo tracing torch.get_autocast_dtype (2.1: a graph break)')
def test_get_autocast_dtype_traces_in_one_graph():

    def f(x):
        return x + 1 if compat.get_autocast_dtype('cpu') == torch.bfloat16 else x

    compiled = torch.compile(f, backend='eager', fullgraph=True)
    assert torch.equal(compiled(torch.zeros(2)), torch.ones(2))


def test_is_exporting_under_jit_trace():
    seen = []

    def f(x):
        seen.append(compat.is_exporting())
        return x * 2

    assert compat.is_exporting() is False
    torch.jit.trace(f, torch.ones(2), check_trace=False)
    f(torch.ones(2))
    assert seen == [True, False]


@pytest.mark.skipif(not hasattr(getattr(torch, 'compiler', None), 'is_exporting'),
                    reason='torch.compiler.is_exporting is missing on this torch')
def test_is_exporting_under_torch_export():
    seen = []

    class M(torch.nn.Module):

        def forward(self, x):
            seen.append(compat.is_exporting())
            return x * 2

    torch.export.export(M(), (torch.ones(2), ))
    assert seen and all(seen)


@pytest.mark.parametrize('dynamo', [False, True])
def test_is_tracing_under_both_onnx_exporters(dynamo, tmp_path):
    """``is_tracing`` leaves ``torch.onnx.is_in_onnx_export`` out (it is slow): each ONNX
    exporter must run the model under a probe it asks (jit tracing, torch.export / dynamo)."""
    if dynamo:
        if not compat.HAS_DYNAMO_ONNX_EXPORT:
            pytest.skip('torch.onnx.export(dynamo=True) needs torch >= 2.5')
        pytest.importorskip('onnxscript')
    seen = []

    class M(torch.nn.Module):

        def forward(self, x):
            seen.append((compat.is_tracing(), torch.onnx.is_in_onnx_export()))
            return x * 2

    kwargs = dict(dynamo=True) if dynamo else (
        dict(dynamo=False) if compat.HAS_DYNAMO_ONNX_EXPORT else {})
    torch.onnx.export(M(), (torch.ones(2, 3), ), str(tmp_path / 'm.onnx'), **kwargs)
    assert seen and all(tracing and onnx for tracing, onnx in seen), seen
    assert compat.is_tracing() is False


def test_requires_torch_helper():
    future = requires_torch((99, 0), 'time travel')
    assert future.args[0] is True and 'torch >= 99.0 for time travel' in future.kwargs['reason']
    assert requires_torch((2, 1), 'the floor').args[0] is False


@pytest.mark.requires_torch((99, ), 'the marker form')
def test_requires_torch_marker_skips():
    raise AssertionError('must have been skipped')


def test_autocast_disabled_with_fp32_dtype_is_a_no_op_on_every_torch():
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with compat.autocast('cpu', torch.float32, enabled=False):
            assert compat.is_autocast_enabled('cpu') is False
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        assert compat.is_autocast_enabled('cpu') is True
    with compat.autocast('cpu', torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_autocast_fp16_on_cpu_works_or_says_why():
    if compat.CPU_AUTOCAST_FP16:
        with compat.autocast('cpu', torch.float16):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    else:
        with pytest.raises(RuntimeError, match='cannot autocast to float16 on CPU'):
            compat.autocast('cpu', torch.float16)


def _cudnn_sdp_enabled() -> bool:
    """torch's cuDNN-attention flag; True (nothing to leave out) where torch has none."""
    probe = getattr(torch.backends.cuda, 'cudnn_sdp_enabled', None)
    return True if probe is None else probe()


def test_sdpa_without_cudnn_leaves_only_cudnn_out_and_restores():
    cuda = torch.backends.cuda
    flags = (_cudnn_sdp_enabled, cuda.flash_sdp_enabled, cuda.mem_efficient_sdp_enabled,
             cuda.math_sdp_enabled)
    before = [f() for f in flags]
    with compat.sdpa_without_cudnn():
        inside = [f() for f in flags]
    assert [f() for f in flags] == before
    leaves_out = compat._NO_CUDNN_SDPA is not None  # a torch with cuDNN attention (2.4 on)
    assert leaves_out or not compat.torch_at_least(2, 4)
    assert inside == ([False] + before[1:] if leaves_out else before)


class _ReportsCuda(torch.Tensor):
    """A CPU tensor that answers ``is_cuda`` as a CUDA one would: what the attention checks
    before it picks the SDPA backends (the arithmetic stays on the CPU)."""

    @property
    def is_cuda(self):
        return True


@pytest.mark.parametrize('with_bias', [False, True])
def test_attention_on_cuda_calls_sdpa_without_cudnn(monkeypatch, with_bias):
    from mmvitswin.core.layers.attention import Attention
    sdpa = torch.nn.functional.scaled_dot_product_attention
    seen = []

    def recording(q, *args, **kwargs):
        seen.append((type(q) is _ReportsCuda, _cudnn_sdp_enabled()))
        return sdpa(q.as_subclass(torch.Tensor), *(a.as_subclass(torch.Tensor) if
                                                   isinstance(a, torch.Tensor) else a
                                                   for a in args), **kwargs)

    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', recording)
    attn = Attention(32, 4).eval()
    q, k, v = (torch.randn(2, 4, 10, 8) for _ in range(3))
    bias = torch.randn(1, 4, 10, 10) if with_bias else None
    with torch.no_grad():
        expected = attn.attend(q, k, v, bias)
        got = attn.attend(*(t.as_subclass(_ReportsCuda) for t in (q, k, v)), bias)
    assert torch.allclose(got.as_subclass(torch.Tensor), expected, atol=1e-6)
    cudnn_on = _cudnn_sdp_enabled()
    assert seen == [(False, cudnn_on),
                    (True, False if compat._NO_CUDNN_SDPA is not None else cudnn_on)]

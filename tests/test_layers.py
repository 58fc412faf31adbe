"""Shared layers: window gather indices, the shift mask, the window-size arithmetic under
torch.compile, attention in mixed precision, the fast-path switch."""
import itertools
import math
import random

import pytest
import torch
import torch.nn.functional as F

from mmvitswin.core.compat import COMPILE_DYNAMIC_OK, CPU_AUTOCAST_FP16
from mmvitswin.core.layers import (FFN, WindowAttention, ceil_div, effective_window,
                                     fast_path_active, merge_windows, pad_to_multiple,
                                     partition_windows, set_fast_path,
                                     shift_window_mask, window_gather_index, window_partition,
                                     window_reverse)
from mmvitswin.core.layers.window import cells_of, padded_size
from conftest import max_rel_err


def loop_shift_mask(padded, window, shift, fill=-100.):
    """The references' mask: label the 3 slices per dim with a Python loop, compare labels."""
    label = torch.zeros((1, *padded, 1))
    slices = [((0, -w), (-w, -s), (-s, None)) if s > 0 else ((0, None), )
              for w, s in zip(window, shift)]
    for count, combo in enumerate(itertools.product(*slices)):
        label[(slice(None), ) + tuple(slice(a, b) for a, b in combo) + (slice(None), )] = count
    labels = window_partition(label, window).squeeze(-1)
    diff = labels[:, None, :] - labels[:, :, None]
    return torch.zeros(diff.shape).masked_fill(diff != 0, fill)


@pytest.mark.parametrize('padded, window, shift', [((14, 21), (7, 7), (3, 3)),
                                                   ((7, 7), (7, 7), (3, 3)),
                                                   ((14, 14), (7, 7), (3, 0)),
                                                   ((4, 14, 14), (2, 7, 7), (1, 3, 3))])
def test_shift_mask_equals_the_loop_built_reference(padded, window, shift):
    got = shift_window_mask(padded, window, shift, torch.device('cpu'))
    assert torch.equal(got, loop_shift_mask(padded, window, shift))


@pytest.mark.skipif(not COMPILE_DYNAMIC_OK, reason='torch.compile(dynamic=True) of these '
                    'helpers needs torch >= 2.6 (see mmvitswin.core.compat)')
def test_a_window_clamped_to_a_traced_size_keeps_the_size_arithmetic_constant():
    """Under torch.compile(dynamic=True) a window clamped to its input (the video Swin's small
    maps) is that input's size: one window along the dim and no padding, as in eager, not
    ``(2s - 1) // s`` (nested floor divisions that took Dynamo minutes to reason about); and
    deciding so adds no guard: a second size reuses the graph."""
    import torch._dynamo
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x):
        (win, ), _ = effective_window((x.shape[1], ), (64, ), (32, ))
        padded = padded_size(x.shape[1], win)
        return x.new_zeros(ceil_div(x.shape[1], win), cells_of(padded, win)), x.new_zeros(padded)

    compiled = torch.compile(f, dynamic=True, fullgraph=True, backend=backend)
    for size in (37, 53):
        with torch._dynamo.config.patch(error_on_recompile=size == 53):
            cells, padded = compiled(torch.randn(2, size))
        assert cells.shape == (1, 1) and padded.shape == (size, )
    assert len(graphs) == 1
    nodes = list(graphs[0].graph.nodes)
    size = [n.meta['example_value'] for n in nodes if n.op == 'placeholder'][-1].shape[1]
    cells, padded = (n.meta['example_value'] for n in nodes[-1].args[0])
    assert all(type(d) is int for d in cells.shape), cells.shape  # constants, not expressions
    assert str(padded.shape[0]) == str(size)


@pytest.mark.parametrize('spatial, window, shift', [((9, 13), (7, 7), (3, 3)),
                                                    ((14, 14), (7, 7), (0, 0)),
                                                    ((5, 17), (7, 7), (3, 3)),
                                                    ((3, 10, 11), (2, 7, 7), (1, 3, 3))])
def test_gather_index_equals_pad_roll_partition(spatial, window, shift):
    x = torch.randn(2, *spatial, 5)
    padded_x, padded = pad_to_multiple(x, window)
    rolled = torch.roll(padded_x, tuple(-s for s in shift), tuple(range(1, len(window) + 1)))
    want = window_partition(rolled, window)
    gather, valid, scatter = window_gather_index(spatial, window, shift, x.device)
    got = x.reshape(2, -1, 5).index_select(1, gather).masked_fill(~valid[:, None], 0.)
    assert torch.equal(got.view_as(want), want)
    back = got.index_select(1, scatter).view_as(x)
    assert torch.equal(back, x)
    # and the reference inverse (reverse, roll back, crop) agrees
    rev = window_reverse(want, window, padded)
    rev = torch.roll(rev, shift, tuple(range(1, len(window) + 1)))
    assert torch.equal(rev[(slice(None), ) + tuple(slice(0, s) for s in spatial)], x)


@pytest.mark.parametrize('spatial, window, shift', [((9, 13), (4, 4), (2, 2)),
                                                    ((8, 12), (4, 4), (0, 0)),
                                                    ((5, 7), (4, 4), (0, 0)),
                                                    ((4, 6, 7), (2, 3, 3), (1, 1, 1))])
def test_window_partition_and_merge_gradients_match_the_plain_gathers(spatial, window, shift):
    """partition_windows / merge_windows with autograd take each other's gather as their
    backward (no index_add): the same values and gradients as autograd through the plain
    gathers (index_select, the padding filled with zeros or with a vector that gets the
    padding rows' gradient), numerically checked to second order."""
    from mmvitswin.core.layers.shifted_window import _Merge, _Partition
    torch.manual_seed(0)
    x = torch.randn(2, *spatial, 5, dtype=torch.double, requires_grad=True)
    fill = torch.randn(5, dtype=torch.double, requires_grad=True)
    gather, valid, scatter = window_gather_index(spatial, window, shift, x.device)
    n = math.prod(window)
    weight = torch.randn(2 * gather.numel() // n, n, 5, dtype=torch.double)

    def ours(x, fill=None):
        windows, index, _ = partition_windows(x, window, shift, fill)
        assert windows._base.grad_fn.name() == _Partition.__name__ + 'Backward'
        mixed = windows * weight + windows.sum(-2, keepdim=True)  # every entry counts
        return mixed, merge_windows(mixed, index, x.shape)

    def plain(x, fill=None):
        windows = x.reshape(2, -1, 5).index_select(1, gather)
        windows = torch.where(valid[:, None], windows, 0. if fill is None else fill)
        mixed = windows.view(-1, n, 5) * weight + windows.view(-1, n, 5).sum(-2, keepdim=True)
        return mixed, mixed.reshape(2, -1, 5).index_select(1, scatter).view_as(x)

    for args in ((x, fill), (x, )):
        got, want = ours(*args), plain(*args)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
        cot = [torch.randn_like(t) for t in got]
        grads_got = torch.autograd.grad(got, args, cot, materialize_grads=True)
        grads_want = torch.autograd.grad(want, args, cot, materialize_grads=True)
        for g, w in zip(grads_got, grads_want):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
        assert torch.autograd.gradcheck(ours, args, fast_mode=True)
        assert torch.autograd.gradgradcheck(ours, args, fast_mode=True)
    # on the CPU the padding entries are listed (and only their rows are filled, zeroed and
    # summed); elsewhere, or traced, masks over every entry: the same values
    from mmvitswin.core.layers.shifted_window import WindowIndex, _padding_sum, _to_windows
    _, index, _ = partition_windows(x.detach(), window, shift)
    assert index.padded == (valid.numel() > int(valid.sum()))
    assert (index.padding is not None) == index.padded
    listed = WindowIndex(gather, valid, scatter, True, (~valid).nonzero().flatten())
    masked = WindowIndex(gather, valid, scatter, True)
    grad = torch.randn(2, gather.numel(), 5, dtype=torch.double)
    torch.testing.assert_close(_padding_sum(grad, listed), _padding_sum(grad, masked),
                               rtol=1e-12, atol=1e-12)
    flat = x.detach().reshape(2, -1, 5)
    for value in (None, fill.detach()):
        assert torch.equal(_to_windows(flat, listed, value), _to_windows(flat, masked, value))
    # the merge's own backward is the partition of the gradient (padding entries 0)
    windows = torch.randn(gather.numel() // n * 2, n, 5, dtype=torch.double, requires_grad=True)
    _, index, _ = partition_windows(x.detach(), window, shift)
    merged = merge_windows(windows, index, x.shape)
    assert merged._base.grad_fn.name() == _Merge.__name__ + 'Backward'
    cot = torch.randn_like(merged)
    got, = torch.autograd.grad(merged, windows, cot)
    want = cot.reshape(2, -1, 5).index_select(1, gather).masked_fill(~valid[:, None], 0.)
    assert torch.equal(got, want.view_as(windows))


@pytest.mark.parametrize('patch', [2, 8, 16])
def test_conv_stem_grid_is_ceil_of_size_over_patch_and_gradients_flow(patch):
    from mmvitswin.core.layers import ConvStem
    stem = ConvStem(3, 64, patch)
    x = torch.randn(2, 3, 37, 50, requires_grad=True)
    tokens, grid = stem(x)
    assert grid == (-(-37 // patch), -(-50 // patch))
    assert tokens.shape == (2, *grid, 64)
    tokens.sum().backward()
    assert x.grad.abs().sum() > 0 and stem.proj.weight.grad.abs().sum() > 0


def test_conv_stem_rejects_bad_sizes():
    from mmvitswin.core.layers import ConvStem
    with pytest.raises(ValueError, match='power of two'):
        ConvStem(3, 64, 12)
    with pytest.raises(ValueError, match='embed_dims divisible by 16'):
        ConvStem(3, 72, 16)


def _explicit_window_attention(attn, x, mask):
    """Swin's attention written out: scaled logits + gathered bias (+ mask per window)."""
    bw, n, c = x.shape
    q, k, v = attn.qkv(x).reshape(bw, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    logits = (q * attn.scale) @ k.transpose(-2, -1)
    table = attn.relative_position_bias_table
    logits = logits + table[attn.relative_position_index.view(-1)].view(n, n, -1).permute(
        2, 0, 1)
    if mask is not None:
        nw = mask.shape[0]
        logits = (logits.view(bw // nw, nw, attn.num_heads, n, n) + mask[None, :, None]).view(
            bw, attn.num_heads, n, n)
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(bw, n, c)
    return attn.proj(out)


@pytest.mark.parametrize('shifted', [False, True])
def test_window_attention_equals_explicit_form_with_and_without_grad(shifted):
    attn = WindowAttention(32, 4, (7, 7))
    x = torch.randn(2 * 6, 49, 32, requires_grad=True)
    mask = shift_window_mask((14, 21), (7, 7), (3, 3), x.device) if shifted else None
    with torch.no_grad():  # SDPA with the (1, nW * heads, N, N) broadcast bias
        assert max_rel_err(attn(x, mask), _explicit_window_attention(attn, x, mask)) < 1e-5
    out = attn(x, mask)  # explicit path: the bias table needs its gradient
    grads = torch.autograd.grad(out.square().sum(), (x, attn.relative_position_bias_table))
    want = _explicit_window_attention(attn, x, mask)
    want_grads = torch.autograd.grad(want.square().sum(), (x, attn.relative_position_bias_table))
    assert max_rel_err(out, want) < 1e-5
    for got, ref in zip(grads, want_grads):
        assert max_rel_err(got, ref) < 1e-4


def test_negligible_masked_logits_get_zero_weight_instead_of_denormal_weights():
    from mmvitswin.core.layers.attention import MASKED_LOGIT_FLOOR, drop_negligible_logits_
    # a row as Swin's -100 shift mask leaves it: allowed logits near 0, masked ones near -100
    logits = torch.tensor([[0.5, -0.3, -100.2, -99.8, -79.0 + 0.5, -81.0 + 0.5]])
    plain = logits.softmax(-1)
    tiny = torch.finfo(torch.float32).tiny
    assert ((plain > 0) & (plain < tiny)).any()  # what the references compute: denormals
    dropped = drop_negligible_logits_(logits.clone())
    assert torch.isinf(dropped[0, 2:4]).all() and torch.isinf(dropped[0, 5])
    assert torch.equal(dropped[0, [0, 1, 4]], logits[0, [0, 1, 4]])  # within the floor: kept
    weights = dropped.softmax(-1)
    assert not ((weights > 0) & (weights < tiny)).any()
    assert (weights - plain).abs().max() < torch.tensor(-MASKED_LOGIT_FLOOR).exp()
    assert weights[0, 4] > 0


def test_masked_window_attention_keeps_a_masked_logit_that_comes_near_the_maximum(monkeypatch):
    """The floor is relative to each row's maximum: with logits spread over hundreds (a large
    qk scale) some masked pairs still carry weight after -100, and must keep it, as in the
    references; every weight the explicit path drops is under e**-80."""
    import mmvitswin.core.layers.attention as attention_module
    calls = []
    real = attention_module.drop_negligible_logits_

    def spy(attn):
        before = attn.detach().clone()
        out = real(attn)
        calls.append((before, out.detach().clone()))
        return out

    monkeypatch.setattr(attention_module, 'drop_negligible_logits_', spy)
    monkeypatch.setattr(attention_module, 'denormals_are_slow', lambda device: True)
    torch.manual_seed(0)
    attn = WindowAttention(32, 4, (7, 7), qk_scale=8.0)
    x = torch.randn(2 * 6, 49, 32, requires_grad=True)
    mask = shift_window_mask((14, 21), (7, 7), (3, 3), x.device)
    out = attn(x, mask)  # training: the explicit path
    want = _explicit_window_attention(attn, x, mask)
    assert len(calls) == 1
    before, after = calls[0]
    kept_masked = (mask[None, :, None] < 0).expand(2, -1, 4, -1, -1).reshape(before.shape) & \
        torch.isfinite(after)
    assert kept_masked.any()  # masked pairs within 80 of the maximum stay
    assert torch.isinf(after).any()
    assert max_rel_err(out, want) < 1e-5
    grads = torch.autograd.grad(out.square().sum(), (x, attn.relative_position_bias_table))
    want_grads = torch.autograd.grad(want.square().sum(), (x, attn.relative_position_bias_table))
    for got, ref in zip(grads, want_grads):
        assert max_rel_err(got, ref) < 1e-4
    attn(x)  # no mask: nothing to drop
    assert len(calls) == 1
    # where denormals cost nothing (AMD Zen 4, GPUs) nothing is dropped, same numbers
    monkeypatch.setattr(attention_module, 'denormals_are_slow', lambda device: False)
    again = attn(x, mask)
    assert len(calls) == 1 and max_rel_err(again, want) < 1e-5


def test_denormals_are_slow_only_on_intel_cpus(monkeypatch):
    from mmvitswin.core.layers import switch
    for vendor, slow in (('GenuineIntel', True), ('AuthenticAMD', False), ('', False)):
        monkeypatch.setattr(switch, '_vendor', vendor)
        assert switch.denormals_are_slow(torch.device('cpu')) is slow
        assert switch.denormals_are_slow('cuda') is False


@pytest.mark.skipif(not CPU_AUTOCAST_FP16, reason='fp16 autocast on CPU needs a newer torch')
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_attention_under_autocast_trains_and_fp16_logits_cannot_overflow(dtype):
    attn = WindowAttention(32, 4, (7, 7))
    with torch.no_grad():
        attn.qkv.weight.mul_(300.)  # logits ~1e6: past fp16's 65504 if computed in fp16
    x = torch.randn(12, 49, 32, requires_grad=True)
    mask = shift_window_mask((14, 21), (7, 7), (3, 3), x.device)
    with torch.autocast('cpu', dtype=dtype):
        out = attn(x, mask)
    assert out.dtype == dtype
    out.float().square().mean().backward()  # backward outside autocast, as AmpOptimWrapper
    assert torch.isfinite(out).all()
    assert torch.isfinite(x.grad).all() and torch.isfinite(attn.qkv.weight.grad).all()
    assert attn.qkv.weight.grad.dtype == torch.float32
    # the unguarded computation does overflow: the test would catch a missing upcast
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.float16):
        q, k, _ = attn.qkv(x).reshape(12, 49, 3, 4, 8).permute(2, 0, 3, 1, 4)
        assert not torch.isfinite(q @ k.transpose(-2, -1)).all()


@pytest.fixture
def fast_path_on():
    """Force the fast path on, whatever this CPU's default (``auto``) is."""
    previous = set_fast_path(True)
    yield
    set_fast_path(previous)


def test_fast_path_default_follows_the_cpu_vendor_and_isa(monkeypatch):
    from mmvitswin.core.layers import switch
    x = torch.randn(3, 5, 16)
    previous = set_fast_path(None)
    try:
        # (vendor, isa, family): on with autograd, on in inference (docs/benchmarks.md)
        for vendor, isa, family, on, infer in (
                ('AuthenticAMD', 'AVX2', 23, True, True), ('HygonGenuine', 'AVX2', 24, True, True),
                ('AuthenticAMD', 'AVX512', 25, False, False),  # Zen 4
                ('AuthenticAMD', 'AVX512', 26, False, True),  # Zen 5: inference only
                ('GenuineIntel', 'AVX2', 6, False, False),
                ('GenuineIntel', 'AVX512', 6, False, False), ('', 'AVX2', 0, False, False)):
            monkeypatch.setattr(switch, '_vendor', vendor)
            monkeypatch.setattr(switch, '_family', family)
            monkeypatch.setattr(switch, 'cpu_capability', lambda isa=isa: isa)
            assert switch.fast_path_pays_here() is on and fast_path_active(x) is on
            assert switch.fast_path_pays_here(autograd=False) is infer
            with torch.no_grad():
                assert fast_path_active(x) is infer
            setting = 'on' if on else 'inference' if infer else 'off'
            assert switch.fast_path_setting() == f'auto ({setting})'
        monkeypatch.setattr(switch, '_vendor', 'AuthenticAMD')
        monkeypatch.setattr(switch, 'cpu_capability', lambda: 'AVX2')
        assert set_fast_path(False) is None and not fast_path_active(x)  # forced off on AMD
        assert switch.fast_path_setting() == 'off'
        monkeypatch.setattr(switch, '_vendor', 'GenuineIntel')
        set_fast_path(True)
        assert fast_path_active(x) and switch.fast_path_setting() == 'on'  # forced on on Intel
    finally:
        set_fast_path(previous)
    monkeypatch.undo()
    monkeypatch.setattr(switch, '_vendor', None)
    monkeypatch.setattr(switch, '_family', None)
    assert isinstance(switch.cpu_vendor(), str)  # read again from this machine
    assert isinstance(switch.cpu_family(), int)
    if hasattr(getattr(torch.backends, 'cpu', None), 'get_cpu_capability'):  # torch >= 2.1
        assert switch.cpu_capability() == torch.backends.cpu.get_cpu_capability()
    with pytest.raises(TypeError, match='enabled'):
        set_fast_path('yes')


def test_fast_path_switch_is_off_under_autocast_and_tracing_and_gives_the_same_numbers(
        fast_path_on):
    ffn = FFN(16, 64)
    x = torch.randn(3, 5, 16, requires_grad=True)
    assert fast_path_active(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not fast_path_active(x)
    outs, grads = [], []
    for enabled in (True, False):
        previous = set_fast_path(enabled)
        try:
            assert fast_path_active(x) is enabled
            out = ffn(x)
            outs.append(out)
            grads.append(torch.autograd.grad(out.square().sum(), (x, ffn.layers[0][0].weight,
                                                                  ffn.layers[1].weight)))
        finally:
            set_fast_path(previous)
    assert max_rel_err(outs[0], outs[1]) < 1e-6
    for a, b in zip(*grads):
        assert max_rel_err(a, b) < 1e-5
    # under autocast the plain path runs and the backward (outside autocast) works
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = ffn(x)
    out.float().sum().backward()
    assert torch.isfinite(ffn.layers[0][0].weight.grad).all()


@pytest.mark.parametrize('named', [False, True])
def test_ffn_inference_through_chunks_equals_the_layers(named, fast_path_on):
    """No grad, fp32, 2 threads: the FFN runs fc1-GELU-fc2 chunk by chunk (layers.linear.
    mlp_inference); same numbers as the plain layers, and the plain path where grad is needed."""
    from mmvitswin.core.layers.linear import mlp_inference
    from mmvitswin.core.layers.mlp import FcNamedFFN
    torch.manual_seed(0)
    ffn = (FcNamedFFN if named else FFN)(48, 192).eval()
    x = torch.randn(2, 1024 + 256 + 64 + 21, 48)  # ladder chunks and an F.linear remainder
    fc1, act, _ = ffn.layers[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            assert mlp_inference(x, fc1, act, ffn.layers[1]) is not None
            got = ffn(x)
            previous = set_fast_path(False)
            try:
                assert mlp_inference(x, fc1, act, ffn.layers[1]) is None
                want = ffn(x)
            finally:
                set_fast_path(previous)
        assert got.shape == want.shape and max_rel_err(got, want) < 1e-5
        assert mlp_inference(x, fc1, act, ffn.layers[1]) is None  # parameters need grad
        assert mlp_inference(x[:, :10], fc1, act, ffn.layers[1]) is None  # too few rows
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize('features', [(384, 1536), (96, 96)])
def test_chunk_plan_uses_the_ladder_only_and_covers_the_rows(features):
    from mmvitswin.core.layers.linear import CHUNK_ROWS, MIN_CHUNK_MACS, _chunks
    assert list(CHUNK_ROWS) == sorted(CHUNK_ROWS, reverse=True)
    macs_per_row = features[0] * features[1]
    smallest = min(s for s in CHUNK_ROWS if s * macs_per_row >= MIN_CHUNK_MACS)
    for rows in (0, 5, CHUNK_ROWS[-1], 2 * CHUNK_ROWS[0] + CHUNK_ROWS[-1] + 7, 100003):
        spans, covered = _chunks(rows, *features)
        assert all(size in CHUNK_ROWS and size >= smallest for _, size in spans)  # bounded set
        ends = [0] + [start + size for start, size in spans]
        assert [start for start, _ in spans] == ends[:-1] and ends[-1] == covered
        assert 0 <= rows - covered < smallest


# rows (96 -> 640 features: chunks of 512 rows and up): several chunks plus a remainder; whole
# chunks only; one chunk and a remainder without bias; the same without input grad; too few
@pytest.mark.parametrize('rows,bias,input_grad', [
    (4096 + 2048 + 1024 + 512 + 256 + 128 + 64 + 37, True, True), (2 * 512, True, True),
    (512 + 44, False, True),
    (2 * 512 + 5, True, False), (50, True, True)])
def test_chunked_linear_equals_f_linear_with_gradients_and_respects_the_switch(
        rows, bias, input_grad, fast_path_on):
    from mmvitswin.core.layers.linear import linear
    torch.manual_seed(0)
    x = torch.randn(rows // 4, 4, 96) if rows % 4 == 0 else torch.randn(rows, 96)
    x.requires_grad_(input_grad)
    weight = torch.randn(640, 96, requires_grad=True)
    bias = torch.randn(640, requires_grad=True) if bias else None
    wrt = [t for t in (x, weight, bias) if t is not None and t.requires_grad]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the oneDNN convolution is chosen with more than one thread
    try:
        got = linear(x, weight, bias)
        want = F.linear(x, weight, bias)
        assert got.shape == want.shape and got.is_contiguous()
        assert max_rel_err(got, want) < 1e-5
        g_got = torch.autograd.grad(got.square().sum(), wrt)
        g_want = torch.autograd.grad(want.square().sum(), wrt)
        for a, b in zip(g_got, g_want):
            assert a.shape == b.shape and max_rel_err(a, b) < 1e-5
        previous = set_fast_path(False)
        try:  # switched off: exactly F.linear
            assert torch.equal(linear(x, weight, bias), want)
        finally:
            set_fast_path(previous)
        with torch.autocast('cpu', dtype=torch.bfloat16):  # autocast decides the dtype
            assert linear(x, weight, bias).dtype == torch.bfloat16
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize('dtype', [torch.bfloat16] + ([torch.float16] if CPU_AUTOCAST_FP16
                                                      else []))
def test_linear_in_autocast_inference_casts_per_layer_to_autocasts_values(dtype, monkeypatch):
    """Eager inference under autocast: ``linear`` casts its operands itself (autocast would keep
    its copy of every weight until the region ends), to the values autocast's ``F.linear``
    gives; with autograd, and for fp64 operands, the casting is left to autocast."""
    from mmvitswin.core.layers import linear as linear_mod
    torch.manual_seed(0)
    x = torch.randn(3, 37, 96)
    layer = linear_mod.Linear(96, 160)
    seen = []
    real = linear_mod._cast_for_autocast
    monkeypatch.setattr(linear_mod, '_cast_for_autocast',
                        lambda *args: seen.append(real(*args)) or seen[-1])
    with torch.autocast('cpu', dtype=dtype):
        want = F.linear(x, layer.weight, layer.bias)
        with torch.no_grad():
            got = layer(x)
        assert [t.dtype for t in seen[-1]] == [dtype] * 3
        assert got.dtype == dtype and torch.equal(got, want.detach())
        trained = layer(x)
        assert all(a is b for a, b in zip(seen[-1], (x, layer.weight, layer.bias)))
        assert trained.requires_grad and torch.equal(trained, want)
        with torch.no_grad():
            double = layer.double()(x.double())
        assert [t.dtype for t in seen[-1]] == [torch.float64] * 3
        assert double.dtype == torch.float64


@pytest.mark.parametrize('tokens', [64, 640])
def test_bf16_cpu_attention_uses_sdpa_only_for_long_sequences(tokens, monkeypatch):
    """bf16 on CPU: the fused SDPA kernel from SDPA_BF16_CPU_MIN_TOKENS tokens on, the explicit
    form below; either way the output is the fp32 attention's to bf16 precision."""
    from mmvitswin.core.layers import attention as attention_mod
    calls = []
    real = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_mod.F, 'scaled_dot_product_attention', counting)
    attn = attention_mod.Attention(64, 4).eval()
    x = torch.randn(2, tokens, 64)
    with torch.no_grad():
        want = attn(x)
        calls.clear()
        got = attn.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert bool(calls) == (tokens >= attention_mod.SDPA_BF16_CPU_MIN_TOKENS)
    assert got.dtype == torch.bfloat16 and max_rel_err(got.float(), want) < 3e-2


def test_a_stage_builds_its_window_indices_once_per_window_and_shift(monkeypatch):
    """Within a Swin stage the blocks share the gather indices and the shift mask of their
    (window, shift) pair; the same features as building them in every block, nothing kept
    after the forward, and a backward through shared indices gives the same gradients."""
    import contextlib

    import mmvitswin.core.backbones.swin as swin_module
    import mmvitswin.core.layers.shifted_window as shifted_window
    from mmvitswin.core import SwinTransformer
    built = {'index': 0, 'mask': 0}
    index, mask = shifted_window.window_gather_index_eager, shifted_window.shift_window_mask

    def counting(kind, fn):
        def wrapped(*args, **kwargs):
            built[kind] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(shifted_window, 'window_gather_index_eager', counting('index', index))
    monkeypatch.setattr(shifted_window, 'shift_window_mask', counting('mask', mask))
    torch.manual_seed(0)
    model = SwinTransformer(embed_dims=32, depths=(2, 4, 1, 2), num_heads=(1, 2, 4, 8),
                            window_size=4)
    x = torch.randn(2, 3, 75, 101)  # padded at every stage
    results = {}
    for mode in ('shared', 'per block'):
        if mode == 'per block':
            monkeypatch.setattr(swin_module, 'shared_window_indices', contextlib.nullcontext)
        for key in built:
            built[key] = 0
        model.eval()
        with torch.no_grad():
            outs = model(x)
        counts = dict(built)
        assert shifted_window._SHARED.get() is None  # dropped with the stage
        model.train()
        model.zero_grad()
        torch.manual_seed(1)  # the same drop-path draws
        sum((o * o).sum() for o in model(x)).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results[mode] = outs, counts, grads
    (shared, n_shared, g_shared), (single, n_single, g_single) = (results['shared'],
                                                                 results['per block'])
    # blocks per stage 2, 4, 1, 2 (odd blocks shifted): per block 9 index sets and 4 masks;
    # shared, one set per (stage, shift) (2 + 2 + 1 + 2) and one mask per stage with a
    # shifted block
    assert n_single == {'index': 9, 'mask': 4}
    assert n_shared == {'index': 7, 'mask': 3}
    assert all(torch.equal(a, b) for a, b in zip(shared, single))
    assert len(g_shared) == len(g_single) and all(
        torch.equal(a, b) for a, b in zip(g_shared, g_single))


@pytest.mark.parametrize('nd', [2, 3])
def test_eager_gather_index_equals_the_traceable_arithmetic(nd):
    """The eager indices (the pad/roll/partition chain run on token numbers) and the traceable
    arithmetic give the same gather, valid and scatter for random sizes, windows (1 to 8,
    larger than the input too) and shifts, 2-D and 3-D."""
    from mmvitswin.core.layers.window import window_gather_index_eager
    rng = random.Random(nd)
    for _ in range(150):
        window = tuple(rng.randint(1, 8) for _ in range(nd))
        spatial = tuple(rng.randint(1, 30 if nd == 2 else 12) for _ in range(nd))
        shift = tuple(rng.choice([0, w // 2, w - 1]) for w in window)
        want = window_gather_index(spatial, window, shift, torch.device('cpu'))
        got = window_gather_index_eager(spatial, window, shift, torch.device('cpu'))
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), (spatial, window, shift)

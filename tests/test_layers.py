"""Shared layers: window plans, the shift mask, the window-size arithmetic under
torch.compile, window attention against its written-out form, attention in mixed precision."""
import itertools
import random

import pytest
import torch
import torch.nn.functional as F

from mmvitswin.core.compat import COMPILE_DYNAMIC_OK, CPU_AUTOCAST_FP16
from mmvitswin.core.layers import (WindowAttention, attention, ceil_div, effective_window,
                                     merge_windows, partition_windows,
                                     window_partition, window_plan, window_reverse)
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
    plan = window_plan(padded, window, shift, torch.device('cpu'))
    assert torch.equal(plan.mask, loop_shift_mask(padded, window, shift))


def _compiled_with_graphs(f):
    """``f`` under ``torch.compile(dynamic=True, fullgraph=True)`` (Dynamo reset first) and the
    list that collects the FX graphs it captures."""
    import torch._dynamo
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return torch.compile(f, dynamic=True, fullgraph=True, backend=backend), graphs


@pytest.mark.slow(reason='torch.compile (Dynamo) at two sizes')
@pytest.mark.skipif(not COMPILE_DYNAMIC_OK, reason='torch.compile(dynamic=True) of these '
                    'helpers needs torch >= 2.6 (see mmvitswin.core.compat)')
def test_a_window_clamped_to_a_traced_size_keeps_the_size_arithmetic_constant():
    """Under torch.compile(dynamic=True) a window clamped to its input (the video Swin's small
    maps) is that input's size: one window along the dim and no padding, as in eager, not
    ``(2s - 1) // s`` (nested floor divisions that took Dynamo minutes to reason about); and
    deciding so adds no guard: a second size reuses the graph."""
    def f(x):
        (win, ), _ = effective_window((x.shape[1], ), (64, ), (32, ))
        padded = padded_size(x.shape[1], win)
        return x.new_zeros(ceil_div(x.shape[1], win), cells_of(padded, win)), x.new_zeros(padded)

    compiled, graphs = _compiled_with_graphs(f)
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


@pytest.mark.slow(reason='torch.compile (Dynamo) at two sizes')
@pytest.mark.skipif(not COMPILE_DYNAMIC_OK, reason='torch.compile(dynamic=True) of these '
                    'helpers needs torch >= 2.6 (see mmvitswin.core.compat)')
def test_traced_window_count_is_a_product_of_the_grid():
    """Under torch.compile(dynamic=True) the windows' batch dim is ``B * cells_h * cells_w``
    as the helpers compute it, also where one dim of the token grid is the window itself (a
    ViTDet window of 3 over the 3 token rows of a 45-pixel-high image): not the division
    ``(B * L) // 9`` of the gathered length, which the shape reasoning cannot simplify and then
    carries, at a cost, through every later shape of the block."""
    def f(x):
        b, h, w, _ = x.shape
        grid = ((h + 15) // 16, (w + 15) // 16)
        plan = window_plan(grid, (3, 3), (0, 0), x.device)
        windows = partition_windows(x[:, :grid[0], :grid[1]], plan)
        return windows, x.new_zeros(b * ceil_div(grid[0], 3) * ceil_div(grid[1], 3))

    compiled, graphs = _compiled_with_graphs(f)
    for size in ((45, 77), (37, 69)):
        x = torch.randn(2, *size, 4)
        with torch._dynamo.config.patch(error_on_recompile=size == (37, 69)):
            windows, _ = compiled(x)
        assert torch.equal(windows, f(x)[0])
    assert len(graphs) == 1
    windows, count = (n.meta['example_value'] for n in list(graphs[0].graph.nodes)[-1].args[0])
    assert str(windows.shape[0]) == str(count.shape[0])


def pad_roll_partition(x, window, shift):
    """The references' chain: zero-pad each dim at its end, roll by -shift, partition."""
    pads = []
    for s, w in zip(reversed(x.shape[1:-1]), reversed(window)):
        pads += [0, -s % w]
    padded = F.pad(x, [0, 0] + pads)
    rolled = torch.roll(padded, tuple(-s for s in shift), tuple(range(1, len(window) + 1)))
    return window_partition(rolled, window), tuple(padded.shape[1:-1])


@pytest.mark.parametrize('spatial, window, shift', [((9, 13), (7, 7), (3, 3)),
                                                    ((14, 14), (7, 7), (0, 0)),
                                                    ((5, 17), (7, 7), (3, 3)),
                                                    ((3, 10, 11), (2, 7, 7), (1, 3, 3))])
def test_window_plan_equals_pad_roll_partition(spatial, window, shift):
    x = torch.randn(2, *spatial, 5)
    want, padded = pad_roll_partition(x, window, shift)
    plan = window_plan(spatial, window, shift, x.device)
    got = partition_windows(x, plan)
    assert torch.equal(got, want)
    assert plan.padded == (padded != spatial)
    assert torch.equal(merge_windows(got, plan, x.shape), x)
    # the reference inverse (reverse, roll back, crop) agrees
    rev = torch.roll(window_reverse(want, window, padded), shift, tuple(range(1, len(window) + 1)))
    assert torch.equal(rev[(slice(None), ) + tuple(slice(0, s) for s in spatial)], x)
    # padding entries are zero; the mask is the loop-built one
    assert not got.reshape(2, -1, 5)[:, plan.is_pad].any()
    if any(shift):
        assert torch.equal(plan.mask, loop_shift_mask(padded, window, shift))
    else:
        assert plan.mask is None


@pytest.mark.parametrize('nd', [2, 3])
def test_window_plans_of_random_sizes_round_trip_with_gradients(nd):
    """Random sizes, windows (1 to 8, larger than the input too) and shifts: the plan's
    partition is the references' chain, merge undoes it, and gradients flow through both as
    through the chain (padding entries get none)."""
    rng = random.Random(nd)
    for _ in range(60):
        window = tuple(rng.randint(1, 8) for _ in range(nd))
        spatial = tuple(rng.randint(1, 30 if nd == 2 else 12) for _ in range(nd))
        shift = tuple(rng.choice([0, w // 2, w - 1]) for w in window)
        x = torch.randn(1, *spatial, 3, dtype=torch.double, requires_grad=True)
        plan = window_plan(spatial, window, shift, x.device)
        got = partition_windows(x, plan)
        want, _ = pad_roll_partition(x, window, shift)
        assert torch.equal(got, want), (spatial, window, shift)
        cot = torch.randn_like(got)
        g_got, = torch.autograd.grad(got, x, cot)
        g_want, = torch.autograd.grad(want, x, cot)
        assert torch.equal(g_got, g_want)
        assert torch.equal(merge_windows(got, plan, x.shape), x)
        if any(shift):
            _, padded = pad_roll_partition(x, window, shift)
            assert torch.equal(plan.mask, loop_shift_mask(padded, window, shift))


def test_window_plan_runs_on_the_meta_device():
    """No data-dependent op (a host sync on a GPU): the plan and a partition build on meta."""
    meta = torch.device('meta')
    plan = window_plan((9, 13), (7, 7), (3, 3), meta)
    x = torch.empty(2, 9, 13, 4, device=meta)
    assert partition_windows(x, plan).shape == (2 * 4, 49, 4)
    assert plan.mask.shape == (4, 49, 49) and plan.mask.is_meta


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


def _explicit_window_attention(attn, x, window, shift):
    """Swin's window attention written out on the padded, shifted windows of ``x``: project,
    scaled logits + gathered bias (+ the shift mask per window), softmax, merge back."""
    b, h, w, c = x.shape
    windows, padded = pad_roll_partition(x, window, shift)
    bw, n, _ = windows.shape
    q, k, v = attn.qkv(windows).reshape(bw, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    logits = (q * attn.scale) @ k.transpose(-2, -1)
    table = attn.relative_position_bias_table
    logits = logits + table[attn.relative_position_index.view(-1)].view(n, n, -1).permute(
        2, 0, 1)
    if any(shift):
        mask = loop_shift_mask(padded, window, shift)
        nw = mask.shape[0]
        logits = (logits.view(bw // nw, nw, attn.num_heads, n, n) + mask[None, :, None]).view(
            bw, attn.num_heads, n, n)
    out = attn.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(bw, n, c))
    out = torch.roll(window_reverse(out, window, padded), shift, (1, 2))
    return out[:, :h, :w]


@pytest.mark.parametrize('shift', [(0, 0), (3, 3)])
@pytest.mark.parametrize('fused', [True, False])
def test_window_attention_equals_explicit_form_with_gradients(shift, fused):
    """Projecting the real tokens before the gather (the projection's bias added to every
    entry, padding included) is the references' projection of padded windows: values and
    gradients, through SDPA and through the explicit path."""
    attn = WindowAttention(32, 4, (7, 7), fused_attn=fused)
    with torch.no_grad():
        attn.qkv.bias.normal_()
    x = torch.randn(2, 11, 17, 32, requires_grad=True)  # padded to 14 x 21
    out = attn(x, window_plan((11, 17), (7, 7), shift, x.device))
    want = _explicit_window_attention(attn, x, (7, 7), shift)
    assert max_rel_err(out, want) < 1e-5
    params = (x, attn.relative_position_bias_table, attn.qkv.weight, attn.qkv.bias)
    grads = torch.autograd.grad(out.square().sum(), params)
    want_grads = torch.autograd.grad(want.square().sum(), params)
    for got, ref in zip(grads, want_grads):
        assert max_rel_err(got, ref) < 1e-4


def test_fused_and_explicit_attention_agree_with_dropout_off():
    q, k, v = (torch.randn(2, 3, 40, 16, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 3, 40, 40)
    fused = attention(q, k, v, bias, scale=0.3)
    explicit = attention(q, k, v, bias, scale=0.3, fused=False)
    assert max_rel_err(explicit, fused) < 1e-5
    for a, b in zip(torch.autograd.grad(fused.sum(), (q, k, v)),
                    torch.autograd.grad(explicit.sum(), (q, k, v))):
        assert max_rel_err(a, b) < 1e-4


@pytest.mark.skipif(not CPU_AUTOCAST_FP16, reason='fp16 autocast on CPU needs a newer torch')
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('fused', [True, False])
def test_attention_under_autocast_trains_and_fp16_logits_cannot_overflow(dtype, fused):
    attn = WindowAttention(32, 4, (7, 7), fused_attn=fused)
    with torch.no_grad():
        attn.qkv.weight.mul_(300.)  # logits ~1e6: past fp16's 65504 if computed in fp16
    x = torch.randn(2, 14, 21, 32, requires_grad=True)
    plan = window_plan((14, 21), (7, 7), (3, 3), x.device)
    with torch.autocast('cpu', dtype=dtype):
        out = attn(x, plan)
    assert out.dtype == dtype
    out.float().square().mean().backward()  # backward outside autocast, as AmpOptimWrapper
    assert torch.isfinite(out).all()
    assert torch.isfinite(x.grad).all() and torch.isfinite(attn.qkv.weight.grad).all()
    assert attn.qkv.weight.grad.dtype == torch.float32
    # the unguarded computation does overflow: the test would catch a missing upcast
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.float16):
        q, k, _ = attn.qkv(x[:, :7, :7].reshape(2, 49, 32)).reshape(2, 49, 3, 4, 8) \
            .permute(2, 0, 3, 1, 4)
        assert not torch.isfinite(q @ k.transpose(-2, -1)).all()


def test_a_stage_builds_two_window_plans_per_forward(monkeypatch):
    """A Swin stage builds one unshifted and one shifted plan per forward and hands them to
    its blocks (none kept between calls): per stage of blocks 2, 4, 1, 2, one or two plans."""
    import mmvitswin.core.backbones.swin as swin_module
    from mmvitswin.core import SwinTransformer
    built = []
    real = swin_module.window_plan

    def counting(spatial, window, shift, device, mask_table=None):
        built.append((tuple(spatial), shift))
        return real(spatial, window, shift, device, mask_table)

    monkeypatch.setattr(swin_module, 'window_plan', counting)
    model = SwinTransformer(embed_dims=32, depths=(2, 4, 1, 2), num_heads=(1, 2, 4, 8),
                            window_size=4).eval()
    with torch.no_grad():
        model(torch.randn(2, 3, 75, 101))
    assert built == [((19, 26), (0, 0)), ((19, 26), (2, 2)), ((10, 13), (0, 0)),
                     ((10, 13), (2, 2)), ((5, 7), (0, 0)), ((3, 4), (0, 0)), ((3, 4), (2, 2))]

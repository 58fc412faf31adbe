"""Swin V2's attention of the real queries with autograd (``_RealQueryAttention``): against
autograd through the plain ops, the whole model against attending every query, and where it
runs. No HF oracle here, so these run on the compatibility stack too."""
import pytest
import torch

from mmvitswin.core.backbones.swin_v2 import SwinTransformerV2
from mmvitswin.core.compat import CPU_AUTOCAST_FP16
from mmvitswin.core.layers import CosineWindowAttention, window_gather_index
from mmvitswin.core.layers.window import real_query_spans
from conftest import max_rel_err
from zoo import perturb_like_trained

NARROW = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))


def _attend_every_query(q, k, v, bias, mask):
    """Oracle: window attention of every query, autograd through the plain ops; q, k, v in
    ``(B, nW * heads, N, d)`` or ``(B * nW, heads, N, d)``, bias ``(heads, N, N)``, mask
    ``(nW, N, N)`` or None."""
    heads, n = bias.shape[0], bias.shape[-1]
    full = bias if mask is None else (mask.unsqueeze(1) + bias).reshape(-1, n, n)
    logits = q.reshape(-1, full.shape[0], n, q.shape[-1]) @ \
        k.reshape(-1, full.shape[0], n, k.shape[-1]).transpose(-2, -1) + full
    return (logits.softmax(-1) @ v.reshape(-1, full.shape[0], n, v.shape[-1])).view(q.shape)


@pytest.mark.parametrize('spatial,shift', [((6, 7), (0, 0)), ((6, 7), (2, 2)),
                                           ((5, 8), (2, 2)), ((8, 3), (0, 0))])
def test_real_query_attention_matches_autograd_through_the_plain_ops(spatial, shift):
    """With autograd the real queries are attended block by block by a function with a
    written-out backward: its outputs at the real queries, 0 at the padding ones, and the
    gradients of a loss on the real queries (q, k, v, the position bias) must be those of
    attending every query. Sizes with one and with several blocks of window columns (the
    windows regathered into block order), shifted (masked layout) and not."""
    from mmvitswin.core.layers.cosine_window import _RealQueryAttention, real_query_plan
    from mmvitswin.core.layers.window import shift_window_mask
    window, heads, d, images, cpu = (4, 4), 2, 3, 2, torch.device('cpu')
    spans = real_query_spans(spatial, window, shift)
    assert spans is not None
    grid = [-(-s // w) for s, w in zip(spatial, window)]
    nw, n = grid[0] * grid[1], window[0] * window[1]
    _, valid, _ = window_gather_index(spatial, window, shift, cpu)
    masked = any(shift)
    shape = (images, nw * heads, n, d) if masked else (images * nw, heads, n, d)
    real = valid.view(1, nw, 1, n, 1).expand(images, nw, heads, n, d).reshape(shape)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, dtype=torch.float64, generator=gen).requires_grad_()
               for _ in range(3))
    bias = (4 * torch.rand(heads, n, n, dtype=torch.float64, generator=gen)).requires_grad_()
    mask = shift_window_mask(tuple(g * w for g, w in zip(grid, window)), window, shift, cpu,
                             dtype=torch.float64) if masked else None
    plan = real_query_plan(spans, window, heads, cpu)
    assert (plan.order is None) == (len(spans[1]) == 1)

    def skipping(q, k, v, bias):
        return _RealQueryAttention.apply(q, k, v, bias, mask, plan, window, heads, False)

    # the queries attended: per window, the hull of its real ones (a pad that the shift puts
    # inside a window is attended with it)
    hull = torch.zeros(grid[0], grid[1], *window, dtype=torch.bool)
    for r0, r1, lr0, lr1 in spans[0]:
        for c0, c1, lc0, lc1 in spans[1]:
            hull[r0:r1, c0:c1, lr0:lr1, lc0:lc1] = True
    hull = hull.view(1, nw, 1, n, 1).expand(images, nw, heads, n, d).reshape(shape)
    assert bool((hull | ~real).all()) and not bool(hull.all())
    got, want = skipping(q, k, v, bias), _attend_every_query(q, k, v, bias, mask)
    assert torch.equal(got[~hull], torch.zeros_like(got[~hull]))
    assert max_rel_err(got[hull].detach(), want[hull].detach()) < 1e-12
    upstream = torch.randn(shape, dtype=torch.float64, generator=gen) * real
    for a, b in zip(torch.autograd.grad(got, (q, k, v, bias), upstream),
                    torch.autograd.grad(want, (q, k, v, bias), upstream)):
        assert max_rel_err(a, b) < 1e-12
    assert torch.autograd.gradcheck(skipping, (q, k, v, bias))
    first, = torch.autograd.grad(skipping(q, k, v, bias), q, upstream.requires_grad_(),
                                 create_graph=True)
    with pytest.raises(RuntimeError, match='once_differentiable'):
        first.sum().backward()


def test_real_query_attention_takes_an_fp32_bias_under_bf16_and_returns_its_fp32_gradient():
    """bf16 q, k, v with the position bias in fp32: the function casts the bias for its sums
    (the outputs those of a bias cast outside, exactly) and returns the bias gradient it sums
    in fp32 as fp32 (rounded to bf16, it is the gradient a bf16 bias gets, exactly)."""
    from mmvitswin.core.layers.cosine_window import _RealQueryAttention, real_query_plan
    from mmvitswin.core.layers.window import shift_window_mask
    window, heads, d, cpu, spatial, shift = (4, 4), 2, 8, torch.device('cpu'), (6, 7), (2, 2)
    spans = real_query_spans(spatial, window, shift)
    nw, n = 4, 16
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, nw * heads, n, d, generator=gen).bfloat16().requires_grad_()
               for _ in range(3))
    bias = (4 * torch.rand(heads, n, n, generator=gen)).requires_grad_()
    mask = shift_window_mask((8, 8), window, shift, cpu, dtype=torch.bfloat16)
    plan = real_query_plan(spans, window, heads, cpu)
    upstream = torch.randn(q.shape, generator=gen).bfloat16()
    outs, grads = [], []
    for b in (bias, bias.detach().bfloat16().requires_grad_()):
        out = _RealQueryAttention.apply(q, k, v, b, mask, plan, window, heads, False)
        outs.append(out)
        grads.append(torch.autograd.grad(out, (q, k, v, b), upstream))
    assert torch.equal(outs[0], outs[1])
    for a, b in zip(grads[0][:3], grads[1][:3]):
        assert torch.equal(a, b)
    assert grads[0][3].dtype == torch.float32 and grads[1][3].dtype == torch.bfloat16
    assert torch.equal(grads[0][3].bfloat16(), grads[1][3])
    assert grads[0][3].abs().sum() > 0


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_real_queries_with_autograd_give_the_gradients_of_attending_every_query(
        dtype, monkeypatch):
    """A training step attends the real queries only (where enough are padding): the
    features and every parameter's gradient must be those of attending every query (fp32
    to float rounding; bf16 to its precision: the bias gradient is summed per block)."""
    import mmvitswin.core.layers.cosine_window as cosine_window
    import mmvitswin.core.layers.shifted_window as shifted_window
    torch.manual_seed(0)
    model = perturb_like_trained(
        SwinTransformerV2(**NARROW, window_size=8, drop_path_rate=0.), 0).train()
    x = torch.randn(2, 3, 72, 100)  # every stage padded, rows and columns
    calls, bias_dtypes = [], set()
    apply = cosine_window._RealQueryAttention.apply
    monkeypatch.setattr(cosine_window._RealQueryAttention, 'apply',
                        lambda *a: calls.append(a[5]) or bias_dtypes.add(a[3].dtype) or apply(*a))
    results = []
    for spans in (shifted_window.real_query_spans, lambda *a: None):
        monkeypatch.setattr(shifted_window, 'real_query_spans', spans)
        model.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            outs = model(x)
        sum(o.float().square().mean() for o in outs).backward()
        results.append(([o.detach().float() for o in outs],
                        [p.grad.clone() for p in model.parameters()]))
    # every block but stage 3's shifted one, where the shift puts the padding inside the
    # window and the real queries' hull is the whole window (nothing to skip)
    assert len(calls) == 7
    assert any(plan.order is not None for plan in calls)
    assert bias_dtypes == {torch.float32}  # the bias enters in fp32 (its gradient stays fp32)
    (outs, grads), (ref_outs, ref_grads) = results
    for a, b in zip(outs, ref_outs):
        assert max_rel_err(a, b) < (1e-5 if dtype == torch.float32 else 1e-2)
    for a, b in zip(grads, ref_grads):
        assert max_rel_err(a, b) < (1e-4 if dtype == torch.float32 else 3e-2)


def test_real_queries_with_autograd_only_where_they_pay():
    """With autograd the real-query function runs in q's dtype without attention dropout
    (fp16 attends in fp32; dropout needs every query's weights), and only where at least
    REAL_QUERY_MIN_SKIPPED of the queries are padding."""
    from mmvitswin.core.layers.cosine_window import REAL_QUERY_MIN_SKIPPED
    attn = CosineWindowAttention(32, 2, (8, 8))
    q = torch.zeros(1, 2, 64, 16)
    many = real_query_spans((12, 12), (8, 8), (0, 0))  # 1 - 144/256 padding
    few = real_query_spans((15, 16), (8, 8), (0, 0))  # 1/16 padding
    assert 1 / 16 < REAL_QUERY_MIN_SKIPPED <= 1 - 144 / 256
    fp32 = torch.float32  # the logits' dtype the attention asks for
    assert attn._attends_real_queries_with_autograd(q, fp32, many)
    assert not attn._attends_real_queries_with_autograd(q, fp32, few)
    assert not attn._attends_real_queries_with_autograd(q.half(), torch.float16, many)
    assert not attn._attends_real_queries_with_autograd(q.bfloat16(), fp32, many)
    if CPU_AUTOCAST_FP16:  # (fp16 autocast on the CPU needs a newer torch)
        with torch.autocast('cpu', dtype=torch.float16):
            assert not attn._attends_real_queries_with_autograd(q, fp32, many)
    dropping = CosineWindowAttention(32, 2, (8, 8), attn_drop=0.1).train()
    assert not dropping._attends_real_queries_with_autograd(q, fp32, many)
    assert dropping.eval()._attends_real_queries_with_autograd(q, fp32, many)

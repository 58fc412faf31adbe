"""SeparableRoIAlign / roi_align against mmcv's RoIAlign (the oracle), and the RoI extractor
that uses it inside mmdet's RoI heads."""
import pytest
import torch
from mmcv.ops import roi_align as mmcv_roi_align

import mmvitswin  # noqa: F401  (registers SeparableRoIExtractor in mmdet's registry)
from mmvitswin.core.ops import SeparableRoIAlign, roi_align

roi_align_module = __import__('mmvitswin.core.ops.roi_align', fromlist=['MAX_CROP_ELEMENTS'])


def random_rois(n, images, extent, smallest=0.0, largest=None, generator=None):
    """(n, 5) boxes of random size, some reaching past the map (which RoIAlign must treat as
    out-of-range samples), on random images."""
    largest = extent if largest is None else largest
    g = generator
    wh = torch.rand(n, 2, generator=g) * (largest - smallest) + smallest
    xy = torch.rand(n, 2, generator=g) * (extent * 1.1) - extent * 0.05 - wh / 2
    index = torch.randint(0, images, (n, 1), generator=g).float()
    return torch.cat([index, xy, xy + wh], 1)


def edge_rois(extent):
    """Boxes on the cases the bilinear rule treats apart: empty, a point, on the last row and
    column, wholly outside, past the -1 / size limits, and covering the whole map."""
    e = float(extent)
    return torch.tensor([
        [0, 10.0, 10.0, 10.0, 10.0],            # empty: no samples, zeros
        [0, 3.0, 4.0, 3.5, 40.0],               # thinner than one output bin
        [1, e - 3.0, e - 3.0, e, e],            # ends on the last row and column
        [1, e + 10.0, 5.0, e + 40.0, 20.0],     # wholly to the right of the map
        [0, -12.0, -12.0, 6.0, 6.0],            # starts above and left of -1
        [1, -4.0, -4.0, e + 4.0, e + 4.0],      # covers the whole map
        [0, 0.0, 0.0, e, e],
    ])


def both(feat, rois, out, scale, ratio, aligned=True):
    """(mmcv's output, our output, mmcv's input grad, our input grad) for one upstream grad."""
    a = feat.detach().clone().requires_grad_()
    b = feat.detach().clone().requires_grad_()
    ref = mmcv_roi_align(a, rois, out, scale, ratio, 'avg', aligned)
    ours = roi_align(b, rois, out, scale, ratio, aligned)
    grad = torch.randn_like(ref)
    ref.backward(grad)
    ours.backward(grad)
    return ref, ours, a.grad, b.grad


@pytest.mark.parametrize('aligned', [True, False])
@pytest.mark.parametrize('ratio', [0, 1, 2])
@pytest.mark.parametrize('out', [7, (14, 14), (5, 9)])
def test_values_and_gradients_match_mmcv(aligned, ratio, out):
    g = torch.Generator().manual_seed(ratio * 7 + aligned)
    stride = 4
    feat = torch.randn(2, 8, 24, 30, generator=g)
    extent = 24 * stride
    rois = torch.cat([random_rois(150, 2, extent, 0.5, 60.0, g), edge_rois(extent)])
    ref, ours, ref_grad, our_grad = both(feat, rois, out, 1 / stride, ratio, aligned)
    assert ours.shape == ref.shape == (rois.shape[0], 8) + ((out, out) if isinstance(out, int)
                                                            else tuple(out))
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(our_grad, ref_grad, atol=5e-5, rtol=1e-4)
    assert ref.abs().sum() > 0 and ref_grad.abs().sum() > 0  # the case exercises real values


def test_empty_and_outside_rois_are_zero_with_no_gradient():
    feat = torch.randn(2, 4, 16, 16, requires_grad=True)
    rois = torch.tensor([[0, 5.0, 5.0, 5.0, 5.0], [1, 100.0, 100.0, 120.0, 130.0]])
    out = roi_align(feat, rois, 7, 0.25, 0, True)
    assert torch.equal(out, torch.zeros(2, 4, 7, 7))
    out.sum().backward()
    assert torch.equal(feat.grad, torch.zeros_like(feat))


def test_grouped_pooling_matches_mmcv(monkeypatch):
    """Many RoIs of mixed sizes, with a crop budget small enough to force several groups:
    the output comes back in RoI order with mmcv's values."""
    g = torch.Generator().manual_seed(3)
    feat = torch.randn(3, 16, 40, 40, generator=g)
    rois = torch.cat([random_rois(300, 3, 160, 1.0, 20.0, g),
                      random_rois(60, 3, 160, 60.0, 150.0, g)])
    rois = rois[torch.randperm(rois.shape[0], generator=g)]
    monkeypatch.setattr(roi_align_module, 'MAX_CROP_ELEMENTS', 16 * 30 * 30 * 8)
    groups = roi_align_module._groups(*_spans(rois, 40, 0.25), 16)
    assert len(groups) > 2
    assert torch.equal(torch.cat([g for g, _, _ in groups]).sort().values,
                       torch.arange(rois.shape[0]))
    span_y, span_x = _spans(rois, 40, 0.25)
    for group, rows_n, cols_n in groups:  # each group's window fits its largest RoI exactly
        assert (rows_n, cols_n) == (int(span_y[group].max()), int(span_x[group].max()))
    ref, ours, ref_grad, our_grad = both(feat, rois, 7, 0.25, 0)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(our_grad, ref_grad, atol=5e-5, rtol=1e-4)


def _spans(rois, size, scale):
    starts = rois[:, 1:3] * scale - 0.5
    sizes = rois[:, 3:5] * scale - 0.5 - starts
    _, _, span_x = roi_align_module._axis_weights(starts[:, 0], sizes[:, 0], 7, 0, size)
    _, _, span_y = roi_align_module._axis_weights(starts[:, 1], sizes[:, 1], 7, 0, size)
    return span_y, span_x


@pytest.mark.parametrize('where', ['bf16 input', 'autocast'])
def test_low_precision_computes_in_fp32_and_returns_the_input_dtype(where):
    g = torch.Generator().manual_seed(5)
    feat = torch.randn(2, 8, 20, 20, generator=g)
    rois = random_rois(64, 2, 80, 2.0, 50.0, g)
    exact = mmcv_roi_align(feat.bfloat16().float(), rois, 7, 0.25, 0, 'avg', True)
    x = feat.bfloat16().requires_grad_()
    if where == 'autocast':
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = roi_align(x, rois.bfloat16(), 7, 0.25, 0, True)
        exact = mmcv_roi_align(feat.bfloat16().float(), rois.bfloat16().float(), 7, 0.25, 0,
                               'avg', True)
    else:
        out = roi_align(x, rois, 7, 0.25, 0, True)
    assert out.dtype == torch.bfloat16
    # fp32 pooling of bf16 values: only the final rounding to bf16 differs
    torch.testing.assert_close(out.float(), exact, atol=1e-2, rtol=8e-3)
    out.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.abs().sum() > 0


def test_rois_get_no_gradient_and_zero_rois_give_an_empty_result():
    feat = torch.randn(1, 3, 8, 8, requires_grad=True)
    rois = torch.tensor([[0, 1.0, 1.0, 20.0, 20.0]], requires_grad=True)
    roi_align(feat, rois, 2, 0.25).sum().backward()
    assert rois.grad is None and feat.grad.abs().sum() > 0
    empty = roi_align(feat, torch.zeros(0, 5), (3, 4), 0.25)
    assert empty.shape == (0, 3, 3, 4)


@pytest.mark.parametrize('call, error, match', [
    (lambda f: roi_align(f[0], torch.zeros(1, 5), 7), ValueError,
     r'input must be a \(N, C, H, W\)'),
    (lambda f: roi_align(f, torch.zeros(4), 7), ValueError, r'rois must be a \(R, 5\)'),
    (lambda f: roi_align(f, torch.zeros(2, 4), 7), ValueError, r'rois must be a \(R, 5\)'),
    (lambda f: roi_align(f, torch.zeros(1, 5), 0), ValueError, 'output_size must be >= 1'),
    (lambda f: roi_align(f, torch.zeros(1, 5), (7, 7, 7)), ValueError,
     'output_size must be an int or a sequence of 2 ints'),
    (lambda f: roi_align(f, torch.zeros(1, 5), 7, sampling_ratio=-1), ValueError,
     'sampling_ratio must be a non-negative int'),
    (lambda f: roi_align(f, torch.zeros(1, 5), 7, sampling_ratio=1.5), TypeError,
     'sampling_ratio must be a non-negative int'),
    (lambda f: roi_align(f, torch.zeros(1, 5), 7, spatial_scale=0), ValueError,
     'spatial_scale must be a finite number > 0'),
    (lambda f: roi_align(f, torch.zeros(1, 5), 7, aligned=1), TypeError, 'aligned must be a bool'),
    (lambda f: roi_align(f, torch.tensor([[2.0, 0, 0, 4, 4]]), 7), ValueError,
     r'rois\[:, 0\] must index the 2 images'),
    (lambda f: roi_align(f.long(), torch.zeros(1, 5), 7), TypeError, 'floating-point'),
    (lambda f: SeparableRoIAlign(7, pool_mode='max'), ValueError, "pool_mode='avg' only"),
    (lambda f: SeparableRoIAlign((7, 0)), ValueError, 'output_size must be >= 1'),
])
def test_bad_arguments_raise_an_error_naming_them(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.zeros(2, 3, 8, 8))


def test_module_matches_mmcv_module_interface():
    from mmcv.ops import RoIAlign
    ours = SeparableRoIAlign(output_size=(7, 7), spatial_scale=0.125, sampling_ratio=2)
    ref = RoIAlign(output_size=(7, 7), spatial_scale=0.125, sampling_ratio=2)
    assert ours.output_size == tuple(ref.output_size)
    g = torch.Generator().manual_seed(11)
    feat = torch.randn(2, 6, 12, 12, generator=g)
    rois = random_rois(40, 2, 96, 4.0, 80.0, g)
    torch.testing.assert_close(ours(feat, rois), ref(feat, rois), atol=2e-5, rtol=1e-4)


@pytest.fixture
def mmdet_scope():
    """Build under mmdet's scope whatever default scope an earlier test's runner left current
    (MMEngine keeps the last created DefaultScope process-wide)."""
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmdet'):
        yield


def _extractors(layer, out):
    from mmdet.registry import MODELS
    common = dict(out_channels=16, featmap_strides=[4, 8, 16, 32])
    ours = MODELS.build(dict(type='SeparableRoIExtractor',
                             roi_layer=dict(type=layer, output_size=out, sampling_ratio=0),
                             **common))
    ref = MODELS.build(dict(type='SingleRoIExtractor',
                            roi_layer=dict(type='RoIAlign', output_size=out, sampling_ratio=0),
                            **common))
    return ours, ref


def test_extractor_matches_mmdet_single_roi_extractor_on_every_level(mmdet_scope):
    ours, ref = _extractors('SeparableRoIAlign', 7)
    assert all(isinstance(m, SeparableRoIAlign) for m in ours.roi_layers)
    g = torch.Generator().manual_seed(2)
    feats = [torch.randn(2, 16, 640 // s, 640 // s, generator=g, requires_grad=True)
             for s in (4, 8, 16, 32)]
    rois = random_rois(400, 2, 640, 4.0, 640.0, g)
    levels = ref.map_roi_levels(rois, 4)
    assert len(levels.unique()) == 4  # every level pools some RoIs
    out, expected = ours(feats, rois), ref(feats, rois)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)
    grads = torch.autograd.grad(out.sum(), feats)
    ref_grads = torch.autograd.grad(expected.sum(), feats)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-4)


def test_extractor_still_builds_mmcv_layers_by_name(mmdet_scope):
    from mmcv.ops import RoIAlign
    ours, _ = _extractors('RoIAlign', 14)
    assert all(type(m) is RoIAlign for m in ours.roi_layers)
    assert [m.spatial_scale for m in ours.roi_layers] == [1 / 4, 1 / 8, 1 / 16, 1 / 32]


def _level_feats(g, channels=16, extent=640, dtype=torch.float32):
    return [torch.randn(2, channels, extent // s, extent // s, generator=g).to(dtype)
            .requires_grad_() for s in (4, 8, 16, 32)]


def test_extractor_roi_scale_factor_single_level_and_unused_levels_match_mmdet(mmdet_scope):
    from mmdet.registry import MODELS
    ours, ref = _extractors('SeparableRoIAlign', 7)
    g = torch.Generator().manual_seed(4)
    feats = _level_feats(g)
    small = random_rois(50, 2, 640, 4.0, 40.0, g)  # only the two finest levels
    assert set(ref.map_roi_levels(small, 4).tolist()) <= {0, 1}
    for factor in (None, 1.5):
        out, expected = ours(feats, small, factor), ref(feats, small, factor)
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)
    # unused levels still receive a (zero) gradient, as mmdet's extractor gives them
    grads = torch.autograd.grad(ours(feats, small).sum(), feats)
    assert all(grad is not None for grad in grads)
    assert grads[3].abs().sum() == 0 and grads[0].abs().sum() > 0
    empty = ours(feats, small[:0])
    assert empty.shape == (0, 16, 7, 7)
    one = dict(roi_layer=dict(type='SeparableRoIAlign', output_size=7, sampling_ratio=0),
               out_channels=16, featmap_strides=[8])
    ours1 = MODELS.build(dict(type='SeparableRoIExtractor', **one))
    ref1 = MODELS.build(dict(one, type='SingleRoIExtractor',
                             roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0)))
    torch.testing.assert_close(ours1(feats[1:2], small), ref1(feats[1:2], small),
                               atol=2e-5, rtol=1e-4)


def test_extractor_pools_bf16_features_at_the_fp32_boxes(mmdet_scope):
    """mmdet's extractor casts the boxes to the features' dtype (``rois.type_as(feats[0])``);
    in bf16 a coordinate near 600 moves by up to 2 pixels. Ours pools at the boxes as given:
    its bf16 output is the exact (fp32) pooling rounded once, while pooling at the rounded
    boxes lands measurably elsewhere."""
    from mmdet.registry import MODELS
    ours = MODELS.build(dict(type='SeparableRoIExtractor', out_channels=16,
                             featmap_strides=[4, 8, 16, 32]))
    g = torch.Generator().manual_seed(6)
    feats = tuple(f.detach() for f in _level_feats(g, dtype=torch.bfloat16))
    rois = random_rois(200, 2, 640, 8.0, 200.0, g)
    rois[:, 1:] = rois[:, 1:].clamp(0, 640) + 0.37  # coordinates bf16 cannot hold
    assert (rois.bfloat16().float() != rois).any()
    exact = ours(tuple(f.float() for f in feats), rois)
    out = ours(feats, rois)
    assert out.dtype == torch.bfloat16
    ours_err = (out.float() - exact).abs().max()
    cast_err = (ours(feats, rois.type_as(feats[0])).float() - exact).abs().max()
    assert ours_err <= exact.abs().max() * 2 ** -8  # one bf16 rounding
    assert cast_err > 4 * ours_err

"""Numerical parity of our SwinTransformer with mmdet 3.3's and mmseg 1.2's own classes."""
import pytest
import torch

from mmvitswin.core.backbones.swin import SwinTransformer
from conftest import max_rel_err

pytestmark = pytest.mark.slow(reason='full-size parity with mmdet/mmseg (forward and gradients)')

SIZES = [(224, 224), (511, 511), (112, 137), (33, 65), (7, 9)]


def _reference(kind: str, **kwargs):
    if kind == 'mmdet':
        from mmdet.models.backbones.swin import SwinTransformer as Ref
    else:
        from mmseg.models.backbones.swin import SwinTransformer as Ref
    ref = Ref(**kwargs)
    ref.init_weights()
    return ref


def _pair(kind: str, **kwargs):
    ref = _reference(kind, **kwargs)
    ours = SwinTransformer(**kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.eval()
    ours.eval()
    return ours, ref


@pytest.fixture(scope='module', params=['mmdet', 'mmseg'])
def swin_pair(request):
    torch.manual_seed(0)
    return _pair(request.param, drop_path_rate=0.1)


@pytest.mark.parametrize('hw', SIZES, ids=[f'{h}x{w}' for h, w in SIZES])
def test_forward_equals_reference(swin_pair, hw):
    ours, ref = swin_pair
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        got = ours(x)
        want = ref(x)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert torch.allclose(g, w, atol=1e-5, rtol=1e-5), (g - w).abs().max()


def test_output_shapes_swin_t_224(swin_pair):
    ours, _ = swin_pair
    with torch.no_grad():
        outs = ours(torch.randn(1, 3, 224, 224))
    assert [tuple(o.shape[1:]) for o in outs] == [(96, 56, 56), (192, 28, 28), (384, 14, 14),
                                                  (768, 7, 7)]


@pytest.mark.parametrize('hw', [(224, 224), (33, 65)], ids=['224x224', '33x65'])
def test_input_gradients_equal_reference(swin_pair, hw):
    ours, ref = swin_pair
    x = torch.randn(2, 3, *hw)
    weights = None
    grads = []
    for model in (ours, ref):
        xi = x.clone().requires_grad_(True)
        outs = model(xi)
        if weights is None:
            weights = [torch.randn_like(o) for o in outs]
        sum((o * w).sum() for o, w in zip(outs, weights)).backward()
        grads.append(xi.grad)
    assert max_rel_err(grads[0], grads[1]) < 1e-4


def test_parameter_gradients_equal_reference():
    # float64: parameter grads sum over many positions, so fp32 round-off would dominate
    ours, ref = _pair('mmdet', drop_path_rate=0.0)
    ours.double()
    ref.double()
    x = torch.randn(1, 3, 64, 80, dtype=torch.float64)
    weights = [torch.randn(1, c, h, w, dtype=torch.float64)
               for c, h, w in [(96, 16, 20), (192, 8, 10), (384, 4, 5), (768, 2, 3)]]
    for model in (ours, ref):
        sum((o * w).sum() for o, w in zip(model(x), weights)).backward()
    ref_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert max_rel_err(p.grad, ref_params[name].grad) < 1e-8, name


def test_sdpa_and_fallback_agree():
    torch.manual_seed(1)
    model = SwinTransformer(drop_path_rate=0.).eval()
    x = torch.randn(1, 3, 97, 130)
    with torch.no_grad():
        fast = model(x)
        for m in model.modules():
            if hasattr(m, 'fused_attn'):
                m.fused_attn = False
        slow = model(x)
    for a, b in zip(fast, slow):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_abs_pos_embed_any_size_matches_reference_at_pretrain_size():
    ours, ref = _pair('mmdet', use_abs_pos_embed=True, pretrain_img_size=64)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for g, w in zip(ours(x), ref(x)):
            assert torch.allclose(g, w, atol=1e-5)
        # the reference cannot run other sizes; ours resizes the embedding bicubically
        outs = ours(torch.randn(1, 3, 96, 72))
    assert tuple(outs[0].shape) == (1, 96, 24, 18)

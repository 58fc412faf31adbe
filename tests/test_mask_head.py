"""ChannelsLastFCNMaskHead and its sub-pixel transposed conv against mmdet's FCNMaskHead and
torch's ConvTranspose2d (the oracles): values, gradients, checkpoint keys, bf16 autocast,
mmdet's mask loss and mask pasting, and the registry entry."""
import pytest
import torch
from mmdet.models.losses import CrossEntropyLoss
from mmdet.models.roi_heads.mask_heads import FCNMaskHead
from mmengine.config import ConfigDict
from mmengine.structures import InstanceData
from torch import nn

import mmvitswin  # noqa: F401  (registers ChannelsLastFCNMaskHead in mmdet's registry)
from mmvitswin.openmmlab.models.mask_head import ChannelsLastFCNMaskHead, _is_subpixel, subpixel_upsample

CHANNELS_LAST = torch.channels_last

UPSAMPLES = {
    'deconv2': dict(type='deconv', scale_factor=2),
    'deconv3': dict(type='deconv', scale_factor=3),
    'bilinear2': dict(type='bilinear', scale_factor=2),
    'nearest2': dict(type='nearest', scale_factor=2),
    'none': dict(type=None),
}


def heads(num_convs=2, upsample='deconv2', class_agnostic=False, in_channels=8, channels=8,
          num_classes=3, dtype=torch.float64, norm_cfg=None):
    """(our head, mmdet's head) with the same kwargs and our weights loaded from mmdet's."""
    kwargs = dict(num_convs=num_convs, in_channels=in_channels, conv_out_channels=channels,
                  num_classes=num_classes, class_agnostic=class_agnostic,
                  upsample_cfg=dict(UPSAMPLES[upsample]), norm_cfg=norm_cfg)
    # mmdet's scope, as in a detector: a Runner an earlier test built in this process may have
    # left another default scope (mmseg's) behind, whose registry has its own CrossEntropyLoss
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmdet'):
        ref = FCNMaskHead(**kwargs)
        ours = ChannelsLastFCNMaskHead(**kwargs)
    with torch.no_grad():  # random weights and nonzero biases, so a misplaced one shows
        for name, p in ref.named_parameters():
            fan_in = p[0].numel() if p.dim() > 1 else 10
            p.copy_(torch.randn_like(p) * (2 / fan_in) ** 0.5)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours.to(dtype), ref.to(dtype)


def forward_backward(head, x, g):
    """(output, input grad, {parameter name: grad}) after backward of (out * g).sum()."""
    x = x.detach().clone().requires_grad_()
    head.zero_grad(set_to_none=True)
    out = head(x)
    (out * g).sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in head.named_parameters()}


# ------------------------------------------------------------------------- subpixel_upsample
def _deconv_case(s, bias, channels_last, cin=6, cout=5):
    g = torch.Generator().manual_seed(s * 2 + bias)
    layer = nn.ConvTranspose2d(cin, cout, s, s, bias=bias).double()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64))
        if bias:
            layer.bias.copy_(torch.randn(cout, generator=g, dtype=torch.float64))
    x = torch.randn(3, cin, 4, 7, generator=g, dtype=torch.float64)  # h != w, n > 1
    if channels_last:
        x = x.contiguous(memory_format=CHANNELS_LAST)
        assert not x.is_contiguous()
    grad = torch.randn(3, cout, 4 * s, 7 * s, generator=g, dtype=torch.float64)
    return layer, x, grad


def _values_and_grads(fn, layer, x, grad):
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    inputs = [x, layer.weight] + ([layer.bias] if layer.bias is not None else [])
    return out, torch.autograd.grad(out, inputs, grad)


@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('s', [2, 3])
def test_subpixel_upsample_matches_conv_transpose(s, bias, channels_last):
    layer, x, grad = _deconv_case(s, bias, channels_last)
    assert _is_subpixel(layer)
    ours, our_grads = _values_and_grads(lambda t: subpixel_upsample(layer, t), layer, x, grad)
    ref, ref_grads = _values_and_grads(layer, layer, x, grad)
    assert ours.shape == ref.shape == (3, 5, 4 * s, 7 * s)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=1e-12)
    assert len(our_grads) == len(ref_grads) == (3 if bias else 2)
    for name, a, b in zip(('input', 'weight', 'bias'), our_grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11, msg=f'grad of {name}')
    if channels_last:
        assert ours.is_contiguous(memory_format=CHANNELS_LAST)


@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('s', [2, 3])
def test_subpixel_upsample_with_activation_matches_relu_of_conv_transpose(s, channels_last):
    layer, x, grad = _deconv_case(s, True, channels_last)
    ours, our_grads = _values_and_grads(lambda t: subpixel_upsample(layer, t, torch.relu),
                                        layer, x, grad)
    ref, ref_grads = _values_and_grads(lambda t: torch.relu(layer(t)), layer, x, grad)
    assert (ref == 0).any() and (ref > 0).any()  # the activation does something here
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=1e-12)
    for name, a, b in zip(('input', 'weight', 'bias'), our_grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11, msg=f'grad of {name}')
    if channels_last:
        assert ours.is_contiguous(memory_format=CHANNELS_LAST)


# ------------------------------------------------------------------------------ _is_subpixel
def test_is_subpixel_accepts_kernel_equal_stride():
    from mmcv.cnn.bricks.wrappers import ConvTranspose2d
    assert _is_subpixel(ConvTranspose2d(4, 4, 2, 2))  # mmdet's 'deconv': mmcv's wrapper
    assert _is_subpixel(nn.ConvTranspose2d(4, 4, 2, 2))
    assert _is_subpixel(nn.ConvTranspose2d(4, 3, 3, 3, bias=False))


@pytest.mark.parametrize('layer', [
    nn.ConvTranspose2d(4, 4, 3, 2),                         # kernel != stride
    nn.ConvTranspose2d(4, 4, 4, 2, padding=1),              # kernel != stride, padding
    nn.ConvTranspose2d(4, 4, 2, 2, padding=1),              # padding
    nn.ConvTranspose2d(4, 4, 2, 2, output_padding=1),       # output_padding
    nn.ConvTranspose2d(4, 4, 2, 2, groups=2),               # groups
    nn.ConvTranspose2d(4, 4, 2, 2, dilation=2),             # dilation
    nn.ConvTranspose2d(4, 4, (2, 1), (2, 1)),               # non-square stride
    nn.ConvTranspose2d(4, 4, (2, 3), (2, 3)),               # non-square stride
    nn.Conv2d(4, 4, 2, 2),                                  # a plain conv
    nn.Upsample(scale_factor=2, mode='bilinear'),
    type('OwnForward', (nn.ConvTranspose2d,), {'forward': lambda self, x: x})(4, 4, 2, 2),
], ids=['k3s2', 'k4s2p1', 'padding', 'output_padding', 'groups', 'dilation', 'stride21',
        'stride23', 'conv2d', 'upsample', 'own_forward'])
def test_is_subpixel_rejects_other_layers(layer):
    assert not _is_subpixel(layer)


# --------------------------------------------------------------------------------- the head
@pytest.mark.parametrize('class_agnostic', [False, True])
@pytest.mark.parametrize('upsample', list(UPSAMPLES))
@pytest.mark.parametrize('num_convs', [0, 2, 4])
def test_head_matches_fcn_mask_head(num_convs, upsample, class_agnostic):
    _assert_head_matches(num_convs, upsample, class_agnostic)


@pytest.mark.parametrize('upsample', ['deconv2', 'bilinear2'])
def test_head_with_group_norm_matches_fcn_mask_head(upsample):
    """The demo's head: GroupNorm after each conv (ConvModule), normalised over channels-last
    activations, against mmdet's head in NCHW."""
    _assert_head_matches(2, upsample, False,
                         norm_cfg=dict(type='GN', num_groups=4, requires_grad=True))


def _assert_head_matches(num_convs, upsample, class_agnostic, norm_cfg=None):
    ours, ref = heads(num_convs, upsample, class_agnostic, norm_cfg=norm_cfg)
    if norm_cfg is not None:
        assert any(isinstance(m, nn.GroupNorm) for m in ours.modules())
    g = torch.Generator().manual_seed(num_convs * 10 + len(upsample) + class_agnostic)
    x = torch.randn(7, 8, 7, 5, generator=g, dtype=torch.float64)  # h != w
    ref_out = ref(x)
    up = {'deconv2': 2, 'deconv3': 3, 'bilinear2': 2, 'nearest2': 2, 'none': 1}[upsample]
    assert ref_out.shape == (7, 1 if class_agnostic else 3, 7 * up, 5 * up)
    grad = torch.randn(ref_out.shape, generator=g, dtype=torch.float64)
    out, x_grad, p_grads = forward_backward(ours, x, grad)
    ref_out, ref_x_grad, ref_p_grads = forward_backward(ref, x, grad)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(x_grad, ref_x_grad, atol=1e-10, rtol=1e-10)
    assert p_grads.keys() == ref_p_grads.keys() and len(p_grads) > 0
    for name, ref_p_grad in ref_p_grads.items():
        assert p_grads[name] is not None, name
        torch.testing.assert_close(p_grads[name], ref_p_grad, atol=1e-10, rtol=1e-10,
                                   msg=f'grad of {name}')
    if upsample.startswith('deconv'):
        assert out.is_contiguous(memory_format=CHANNELS_LAST)
        if not class_agnostic:  # with one channel both layouts coincide
            assert not out.is_contiguous()


@pytest.mark.parametrize('upsample', ['deconv2', 'deconv3'])
def test_head_uses_the_subpixel_path_for_its_deconv(upsample, monkeypatch):
    """The deconv layer's own forward (oneDNN's transposed conv) is not called."""
    ours, ref = heads(2, upsample)
    assert _is_subpixel(ours.upsample)

    def fail(*args, **kwargs):
        raise AssertionError('ConvTranspose2d.forward called')
    monkeypatch.setattr(ours.upsample, 'forward', fail)
    x = torch.randn(6, 8, 7, 7, dtype=torch.float64)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-10, rtol=1e-10)


def test_head_falls_back_to_the_layer_for_other_deconvs():
    """A deconv that is not kernel == stride (swapped in after construction) still runs the
    layer and the ReLU, like mmdet's forward."""
    ours, ref = heads(1, 'deconv2')
    layer = nn.ConvTranspose2d(8, 8, 4, 2, padding=1).double()
    ref.upsample = layer
    ours.upsample = layer
    assert not _is_subpixel(layer)
    x = torch.randn(6, 8, 7, 7, dtype=torch.float64)
    grad = torch.randn(6, 3, 14, 14, dtype=torch.float64)
    out, x_grad, p_grads = forward_backward(ours, x, grad)
    ref_out, ref_x_grad, ref_p_grads = forward_backward(ref, x, grad)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(x_grad, ref_x_grad, atol=1e-10, rtol=1e-10)
    for name, ref_p_grad in ref_p_grads.items():
        torch.testing.assert_close(p_grads[name], ref_p_grad, atol=1e-10, rtol=1e-10,
                                   msg=f'grad of {name}')


def test_head_handles_zero_rois():
    ours, ref = heads(2, 'deconv2')
    x = torch.zeros(0, 8, 7, 7, dtype=torch.float64, requires_grad=True)
    out = ours(x)
    assert out.shape == ref(x).shape == (0, 3, 14, 14)
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_head_accepts_nchw_and_channels_last_inputs_alike():
    ours, ref = heads(2, 'deconv2')
    x = torch.randn(6, 8, 7, 7, dtype=torch.float64)
    a = ours(x)
    b = ours(x.contiguous(memory_format=CHANNELS_LAST))
    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(a, ref(x), atol=1e-10, rtol=1e-10)


# ------------------------------------------------------------------------------ state dict
@pytest.mark.parametrize('class_agnostic', [False, True])
@pytest.mark.parametrize('upsample', list(UPSAMPLES))
@pytest.mark.parametrize('num_convs', [0, 4])
def test_state_dict_keys_and_shapes_match_fcn_mask_head(num_convs, upsample, class_agnostic):
    kwargs = dict(num_convs=num_convs, in_channels=8, conv_out_channels=16, num_classes=3,
                  class_agnostic=class_agnostic, upsample_cfg=dict(UPSAMPLES[upsample]))
    ours = ChannelsLastFCNMaskHead(**kwargs).state_dict()
    ref = FCNMaskHead(**kwargs).state_dict()
    assert list(ours) == list(ref)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in ref.items()}
    assert ('upsample.weight' in ours) == upsample.startswith('deconv')


def test_loads_an_fcn_mask_head_checkpoint_and_back():
    ours, ref = heads(2, 'deconv2', dtype=torch.float32)
    fresh = FCNMaskHead(num_convs=2, in_channels=8, conv_out_channels=8, num_classes=3)
    fresh.load_state_dict(ours.state_dict(), strict=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


# ---------------------------------------------------------------------------- bf16 autocast
def _rel(a, b):
    """||a - b|| / ||b|| in float32."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize('upsample', ['deconv2', 'bilinear2'])
def test_bf16_autocast_matches_fcn_mask_head(upsample):
    """Under CPU bf16 autocast our head gives mmdet's autocast output and gradients, and both
    stay near the float32 result (bf16's backward through four ReLU convs loses about 10% of
    the input gradient's norm, for mmdet's head as much as ours)."""
    ours, ref = heads(4, upsample, in_channels=16, channels=16, dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 16, 14, 14, generator=g)
    grad = torch.randn(8, 3, 28, 28, generator=g)
    exact, exact_x_grad, exact_p_grads = forward_backward(ref, x, grad)  # float32 reference
    results = []
    for head in (ours, ref):
        with torch.autocast('cpu', torch.bfloat16):
            out, x_grad, p_grads = forward_backward(head, x, grad)
        results.append((out.detach(), x_grad, p_grads))
        assert out.dtype == torch.bfloat16
        assert x_grad.dtype == torch.float32 and torch.isfinite(x_grad).all()
        assert all(p.dtype == torch.float32 and torch.isfinite(p).all()
                   for p in p_grads.values())
        scale = float(exact.abs().max())
        torch.testing.assert_close(out.float(), exact, atol=5e-2 * scale, rtol=5e-2)
        assert _rel(out, exact) < 2e-2
        assert _rel(x_grad, exact_x_grad) < 0.25
        for name, p_grad in p_grads.items():
            assert _rel(p_grad, exact_p_grads[name]) < 0.25, name
    (out, x_grad, p_grads), (ref_out, ref_x_grad, ref_p_grads) = results
    torch.testing.assert_close(out.float(), ref_out.float(),
                               atol=2e-2 * float(ref_out.abs().max()), rtol=2e-2)
    # The input gradients, judged against bf16's own error: ours differs from mmdet's autocast
    # gradient by less than three quarters of what mmdet's differs from float32. (On a CPU
    # without native bf16 the emulated kernels round differently for the two memory layouts:
    # 2.7 % relative and 0.18 of 3.0 at most between the heads, against 0.75 between mmdet's
    # and float32; AMD EPYC with AVX2 only.)
    assert _rel(x_grad, ref_x_grad) < 0.75 * _rel(ref_x_grad, exact_x_grad)
    assert float((x_grad - ref_x_grad).abs().max()) < \
        0.75 * float((ref_x_grad - exact_x_grad).abs().max())
    for name, ref_p_grad in ref_p_grads.items():  # weights: ours as near float32 as mmdet's
        exact_p = exact_p_grads[name]
        assert _rel(p_grads[name], exact_p) < max(1.25 * _rel(ref_p_grad, exact_p), 2e-2), name


# -------------------------------------------------------------------------- mmdet's mask loss
@pytest.mark.parametrize('class_agnostic', [False, True])
def test_mmdet_mask_loss_matches_on_our_output(class_agnostic):
    ours, ref = heads(2, 'deconv2', class_agnostic)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 8, 7, 7, generator=g, dtype=torch.float64)
    targets = (torch.rand(7, 14, 14, generator=g) > 0.5).double()
    labels = torch.randint(0, 3, (7,), generator=g)
    if class_agnostic:  # as FCNMaskHead.loss_and_target does
        labels = torch.zeros_like(labels)
    loss_fn = CrossEntropyLoss(use_mask=True, loss_weight=1.0)
    losses, grads = [], []
    for head in (ours, ref):
        xi = x.clone().requires_grad_()
        preds = head(xi)
        loss = loss_fn(preds, targets, labels)
        assert torch.allclose(loss, head.loss_mask(preds, targets, labels))
        loss.backward()
        losses.append(loss)
        grads.append((xi.grad, {n: p.grad for n, p in head.named_parameters()}))
    assert losses[0].dtype == torch.float64 and torch.isfinite(losses[0]).all()
    torch.testing.assert_close(losses[0], losses[1], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-12, rtol=1e-10)
    for name, ref_p_grad in grads[1][1].items():
        torch.testing.assert_close(grads[0][1][name], ref_p_grad, atol=1e-12, rtol=1e-10,
                                   msg=f'grad of {name}')
    assert grads[0][0].abs().sum() > 0


# --------------------------------------------------------------------------------- registry
def test_mmdet_registry_builds_our_head():
    from mmdet.registry import MODELS
    head = MODELS.build(dict(type='ChannelsLastFCNMaskHead', num_convs=2, in_channels=8,
                             conv_out_channels=8, num_classes=3))
    assert isinstance(head, ChannelsLastFCNMaskHead)
    assert isinstance(head, FCNMaskHead)
    assert len(head.convs) == 2 and head.conv_logits.out_channels == 3
    out = head(torch.randn(6, 8, 7, 7))
    assert out.shape == (6, 3, 14, 14)


# ---------------------------------------------------------------------------- predict path
@pytest.mark.parametrize('rescale', [False, True])
@pytest.mark.parametrize('class_agnostic', [False, True])
def test_predict_by_feat_gives_the_same_masks(class_agnostic, rescale):
    ours, ref = heads(2, 'deconv2', class_agnostic, dtype=torch.float32)
    g = torch.Generator().manual_seed(9)
    counts = (4, 3)  # RoIs of two images
    x = torch.randn(sum(counts), 8, 7, 7, generator=g)
    with torch.no_grad():
        preds = ours(x), ref(x)
    assert preds[0].is_contiguous(memory_format=CHANNELS_LAST)
    xy = torch.rand(sum(counts), 2, generator=g) * 40
    bboxes = torch.cat([xy, xy + 8 + torch.rand(sum(counts), 2, generator=g) * 30], 1)
    labels = torch.randint(0, 3, (sum(counts),), generator=g)
    scores = torch.rand(sum(counts), generator=g)
    metas = [dict(ori_shape=(64, 80), scale_factor=(1.25, 1.5)),
             dict(ori_shape=(72, 60), scale_factor=(1.0, 1.0))]
    cfg = ConfigDict(mask_thr_binary=0.5)
    masks = []
    for head, pred in zip((ours, ref), preds):
        results = []
        for i, sl in enumerate(torch.arange(sum(counts)).split(counts)):
            results.append(InstanceData(bboxes=bboxes[sl].clone(), labels=labels[sl],
                                        scores=scores[sl], metainfo=metas[i]))
        # mmdet's own method (ours inherits it) on each head's output
        out = FCNMaskHead.predict_by_feat(head, pred.split(counts), results, metas, cfg,
                                          rescale=rescale)
        masks.append([r.masks for r in out])
    for a, b in zip(*masks):
        assert a.dtype == torch.bool
        assert a.shape == b.shape
        assert torch.equal(a, b)
        assert a.any() and not a.all()
    h, w = metas[0]['ori_shape']
    expected = (h, w) if rescale else (round(h * 1.5), round(w * 1.25))
    assert masks[0][0].shape[1:] == expected

"""HybridViT: weight-standardised conv, ResNetV2 front end, pyramid, freezing, timm checkpoints."""
import math
import random
import warnings
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F

from mmvitswin.core.checkpoint import (convert_hybrid_state_dict, detect_hybrid_format,
                                  load_state_dict_reported)
from mmvitswin.core.backbones.hybrid_vit import (HybridViT, MaxPool2dSame, StdConv2d,
                                                   same_padding)

# A small hybrid for behaviour tests: real block types, few of them.
SMALL = dict(arch=dict(embed_dims=192, num_layers=2, num_heads=3, feedforward_channels=768),
             cnn_depths=(1, 1, 1))


@pytest.fixture(autouse=True, scope='module')
def _one_thread():
    # Several engineers share 2 cores: one intra-op thread avoids OpenMP oversubscription
    # (10x slower here with 2 threads under load); restored for the other test modules.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _hand_standardized(w: torch.Tensor, eps: float) -> torch.Tensor:
    """Per output channel: subtract the mean, divide by sqrt(biased variance + eps)."""
    n = w[0].numel()
    mean = w.sum(dim=(1, 2, 3), keepdim=True) / n
    var = ((w - mean)**2).sum(dim=(1, 2, 3), keepdim=True) / n
    return (w - mean) / torch.sqrt(var + eps)


# ------------------------------------------------------------------------------- StdConv2d
@pytest.mark.parametrize('stride,groups,size', [(1, 1, (9, 11)), (2, 1, (10, 7)), (2, 2, (9, 9))])
def test_stdconv_equals_conv_with_hand_standardized_weight(stride, groups, size):
    conv = StdConv2d(8, 12, 3, stride=stride, groups=groups, bias=True).double()
    assert conv.eps == 1e-8  # the documented default (timm's R50 hybrid)
    with torch.no_grad():
        conv.weight.mul_(3.).add_(0.5)  # far from standardised, so the test can fail
    x = torch.randn(2, 8, *size, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn_like(conv(x))

    y = conv(x)
    y.backward(upstream)

    w_ref = conv.weight.detach().clone().requires_grad_(True)
    b_ref = conv.bias.detach().clone().requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    top, bottom = same_padding(size[0], 3, stride)
    left, right = same_padding(size[1], 3, stride)
    y_ref = F.conv2d(F.pad(x_ref, (left, right, top, bottom)), _hand_standardized(w_ref, 1e-8),
                     b_ref, stride=stride, groups=groups)
    y_ref.backward(upstream)

    assert y.shape == y_ref.shape == (2, 12, math.ceil(size[0] / stride),
                                      math.ceil(size[1] / stride))
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=1e-10)
    # gradients of the raw weight go through the mean and variance of the standardisation
    torch.testing.assert_close(conv.weight.grad, w_ref.grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(conv.bias.grad, b_ref.grad, rtol=1e-10, atol=1e-10)
    plain = F.conv2d(F.pad(x_ref, (left, right, top, bottom)), w_ref, b_ref, stride=stride,
                     groups=groups)
    assert (plain - y_ref).abs().max() > 1e-2  # standardisation does change the result


def test_stdconv_eps_is_used():
    """A nearly constant kernel (variance 1e-8) is divided by sqrt(1e-8 + eps)."""
    conv = StdConv2d(1, 1, 1, padding=0).double()
    conv.weight.data = torch.tensor([[[[1.0]]]], dtype=torch.float64)
    x = torch.ones(1, 1, 2, 2, dtype=torch.float64)
    assert torch.all(conv(x) == 0)  # one weight: zero after mean removal, no NaN
    conv = StdConv2d(2, 1, 1, padding=0, eps=1e-8).double()
    conv.weight.data = torch.tensor([1.0 + 1e-4, 1.0 - 1e-4],
                                    dtype=torch.float64).view(1, 2, 1, 1)
    x = torch.tensor([1.0, 0.0], dtype=torch.float64).view(1, 2, 1, 1)
    expected = 1e-4 / math.sqrt(1e-8 + 1e-8)
    assert conv(x).item() == pytest.approx(expected, rel=1e-9)


def test_same_padding_matches_tensorflow_rule():
    # TF SAME: out = ceil(n / s), total = max((out - 1) * s + k - n, 0), extra pad after
    assert same_padding(224, 7, 2) == (2, 3)
    assert same_padding(112, 3, 2) == (0, 1)
    assert same_padding(15, 3, 2) == (1, 1)
    assert same_padding(16, 1, 2) == (0, 0)
    assert same_padding(7, 3, 1) == (1, 1)
    pool = MaxPool2dSame(kernel_size=3, stride=2)
    x = -torch.rand(1, 1, 4, 4) - 1  # all negative: a zero pad would win the max
    out = pool(x)
    assert out.shape == (1, 1, 2, 2)
    assert out[0, 0, 1, 1] == x[0, 0, 2:, 2:].max()  # window 2..4 is half padding


# ------------------------------------------------------------------------------ front end
def test_bottleneck_order_matches_hand_composition():
    """timm's non-pre-act block: conv1-GN-ReLU, conv2(stride)-GN-ReLU, conv3-GN, + shortcut
    (strided 1x1 StdConv + GN), ReLU after the add."""
    from mmvitswin.core.backbones.hybrid_vit import Bottleneck
    block = Bottleneck(64, 256, stride=2, project=True).double()
    for m in block.modules():  # non-trivial affine GN parameters
        if isinstance(m, torch.nn.GroupNorm):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    x = torch.randn(2, 64, 15, 10, dtype=torch.float64)

    def conv(mod, t, stride=1):
        k = mod.weight.shape[-1]
        top, bottom = same_padding(t.shape[-2], k, stride)
        left, right = same_padding(t.shape[-1], k, stride)
        return F.conv2d(F.pad(t, (left, right, top, bottom)),
                        _hand_standardized(mod.weight, 1e-8), stride=stride)

    def gn(mod, t):
        return F.group_norm(t, 32, mod.weight, mod.bias, 1e-5)

    y = F.relu(gn(block.norm1, conv(block.conv1, x)))
    y = F.relu(gn(block.norm2, conv(block.conv2, y, stride=2)))
    y = gn(block.norm3, conv(block.conv3, y))
    shortcut = gn(block.downsample.norm, conv(block.downsample.conv, x, stride=2))
    expected = F.relu(y + shortcut)
    out = block(x)
    assert out.shape == (2, 256, 8, 5)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_front_end_and_vit_input_at_224():
    model = HybridViT(num_layers=1).eval()  # real R50 front end and ViT-B width
    seen = {}

    def record(module, args):
        seen['seq'] = args[0].shape  # returns None: the input is left unchanged

    model.blocks[0].register_forward_pre_hook(record)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        feats, seq, grid = model.forward_vit_input(x)
        outs = model(x)
    assert [tuple(f.shape[1:]) for f in feats] == [(256, 56, 56), (512, 28, 28), (1024, 14, 14)]
    assert grid == (14, 14)
    assert tuple(seq.shape) == (1, 196 + 1, 768)
    assert tuple(seen['seq']) == (1, 197, 768)  # what the first ViT block actually receives
    assert [tuple(o.shape[1:]) for o in outs] == [(256, 56, 56), (512, 28, 28), (768, 14, 14),
                                                  (768, 7, 7)]
    # the CNN levels are the front end's maps themselves (no projection by default)
    torch.testing.assert_close(outs[0], feats[0])
    torch.testing.assert_close(outs[3], F.max_pool2d(outs[2], 2))


def _random_sizes(n=3, seed=0):
    rng = random.Random(seed)
    return [(rng.randint(20, 90), rng.randint(20, 90)) for _ in range(n)]


@pytest.mark.parametrize('size', [(64, 64), (33, 65), (1, 1), (47, 17)] + _random_sizes())
@pytest.mark.parametrize('out_channels,expected_c', [
    (None, [256, 512, 192, 192]),  # native: CNN stages 1-2, ViT width twice
    (64, [64, 64, 64, 64]),
    ([32, None, 64, 96], [32, 512, 64, 96]),
])
def test_pyramid_shapes(size, out_channels, expected_c):
    model = HybridViT(**SMALL, out_channels=out_channels).eval()
    with torch.no_grad():
        outs = model(torch.randn(2, 3, *size))
    assert len(outs) == 4 and model.num_features == expected_c
    for o, stride, c in zip(outs, (4, 8, 16, 32), expected_c):
        assert tuple(o.shape) == (2, c, math.ceil(size[0] / stride), math.ceil(size[1] / stride))
        assert torch.isfinite(o).all()


def test_out_indices_select_levels():
    model = HybridViT(**SMALL, out_indices=(1, 3)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 70, 40))
    assert [tuple(o.shape) for o in outs] == [(1, 512, 9, 5), (1, 192, 3, 2)]


def test_backward_reaches_every_parameter():
    model = HybridViT(**SMALL, out_channels=32).train()
    outs = model(torch.randn(2, 3, 48, 80))
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_with_cp_matches_plain():
    torch.manual_seed(1)
    plain = HybridViT(**SMALL)
    ckpt = HybridViT(**SMALL, with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 40, 56)
    grads = []
    for model in (plain, ckpt):
        outs = model(x)
        sum(o.square().mean() for o in outs).backward()
        grads.append(model.patch_embed.backbone.stem.conv.weight.grad.clone())
    for a, b in zip(plain(x), ckpt(x)):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('frozen', [0, 2, 3, 4])
def test_frozen_stages_get_no_grad(frozen):
    model = HybridViT(**SMALL, out_channels=32, frozen_stages=frozen, drop_path_rate=0.1)
    model.train()  # train() must keep the frozen parts frozen and in eval mode
    outs = model(torch.randn(1, 3, 64, 48))
    sum(o.sum() for o in outs).backward()
    cnn = model.patch_embed.backbone
    frozen_mods = [cnn.stem] + list(cnn.stages[:min(frozen, 3)])
    if frozen >= 3:
        frozen_mods += [model.patch_embed.proj] + list(model.blocks[:frozen - 3])
    frozen_ids = {id(p) for m in frozen_mods for p in m.parameters()}
    if frozen >= 3:
        frozen_ids |= {id(model.cls_token), id(model.pos_embed)}
    for m in frozen_mods:
        assert not m.training
    for name, p in model.named_parameters():
        if id(p) in frozen_ids:
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.requires_grad and p.grad is not None, name
    assert any(p.grad is not None for p in model.level_projs.parameters())
    assert model.blocks[-1].training


def test_layer_depths_for_layer_decay():
    model = HybridViT(**SMALL, out_channels=32)
    assert model.get_layer_depth('patch_embed.backbone.stem.conv.weight') == 0
    assert model.get_layer_depth('patch_embed.proj.weight') == 0
    assert model.get_layer_depth('blocks.1.attn.qkv.weight') == 2
    assert model.get_layer_depth('level_projs.0.0.weight') == model.num_layers + 1


def test_registered_in_hosts():
    import mmvitswin  # noqa: F401
    from mmdet.registry import MODELS as DET
    from mmseg.registry import MODELS as SEG
    for registry in (DET, SEG):
        model = registry.build(dict(type='HybridViT', **SMALL))
        assert isinstance(model, HybridViT)


def test_bad_input_and_arguments():
    model = HybridViT(**SMALL).eval()
    with pytest.raises(ValueError, match='in_channels=3'):
        model(torch.randn(1, 4, 32, 32))
    with pytest.raises(ValueError, match='4-D'):
        model(torch.randn(3, 32, 32))
    with pytest.raises(TypeError, match='floating'):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match='out_indices'):
        HybridViT(**SMALL, out_indices=(0, 4))
    with pytest.raises(ValueError, match='frozen_stages'):
        HybridViT(**SMALL, frozen_stages=3 + 2 + 1)
    with pytest.raises(ValueError, match='divisible by 32'):
        HybridViT(**SMALL, out_channels=48)
    with pytest.raises(TypeError, match='out_channels'):
        HybridViT(**SMALL, out_channels=[64, 64])
    with pytest.raises(ValueError, match='3 stages'):
        HybridViT(arch=SMALL['arch'], cnn_depths=(1, 1), cnn_channels=(256, 512))
    with pytest.raises(ValueError, match='multiples of 128'):
        HybridViT(arch=SMALL['arch'], cnn_depths=(1, 1, 1), cnn_channels=(256, 500, 1024))
    with pytest.raises(ValueError, match='eps'):
        StdConv2d(3, 8, 3, eps=0.)


# ---------------------------------------------------------------------------- checkpoints
def timm_hybrid_shapes(cnn_depths=(3, 4, 9), embed_dims=768, num_layers=12, img_size=384,
                       num_classes=1000, in21k=False) -> 'OrderedDict[str, tuple]':
    """Key -> shape of timm's ``vit_base_r50_s16_384`` state dict (``_224_in21k`` with
    ``in21k``), written from timm's module names (ResNetV2 non-pre-act ``Bottleneck``,
    ``DownsampleConv``, ``HybridEmbed``, ``VisionTransformer``), not from timm itself."""
    sd = OrderedDict()
    cnn = 'patch_embed.backbone.'
    sd[cnn + 'stem.conv.weight'] = (64, 3, 7, 7)
    sd[cnn + 'stem.norm.weight'] = sd[cnn + 'stem.norm.bias'] = (64, )
    prev = 64
    for i, (depth, chs) in enumerate(zip(cnn_depths, (256, 512, 1024))):
        mid = chs // 4
        for j in range(depth):
            p = f'{cnn}stages.{i}.blocks.{j}.'
            cin = prev if j == 0 else chs
            if j == 0:
                sd[p + 'downsample.conv.weight'] = (chs, cin, 1, 1)
                sd[p + 'downsample.norm.weight'] = sd[p + 'downsample.norm.bias'] = (chs, )
            sd[p + 'conv1.weight'] = (mid, cin, 1, 1)
            sd[p + 'norm1.weight'] = sd[p + 'norm1.bias'] = (mid, )
            sd[p + 'conv2.weight'] = (mid, mid, 3, 3)
            sd[p + 'norm2.weight'] = sd[p + 'norm2.bias'] = (mid, )
            sd[p + 'conv3.weight'] = (chs, mid, 1, 1)
            sd[p + 'norm3.weight'] = sd[p + 'norm3.bias'] = (chs, )
        prev = chs
    sd['patch_embed.proj.weight'] = (embed_dims, 1024, 1, 1)
    sd['patch_embed.proj.bias'] = (embed_dims, )
    sd['cls_token'] = (1, 1, embed_dims)
    sd['pos_embed'] = (1, 1 + (img_size // 16)**2, embed_dims)
    for k in range(num_layers):
        p = f'blocks.{k}.'
        sd[p + 'norm1.weight'] = sd[p + 'norm1.bias'] = (embed_dims, )
        sd[p + 'attn.qkv.weight'] = (3 * embed_dims, embed_dims)
        sd[p + 'attn.qkv.bias'] = (3 * embed_dims, )
        sd[p + 'attn.proj.weight'] = (embed_dims, embed_dims)
        sd[p + 'attn.proj.bias'] = (embed_dims, )
        sd[p + 'norm2.weight'] = sd[p + 'norm2.bias'] = (embed_dims, )
        sd[p + 'mlp.fc1.weight'] = (4 * embed_dims, embed_dims)
        sd[p + 'mlp.fc1.bias'] = (4 * embed_dims, )
        sd[p + 'mlp.fc2.weight'] = (embed_dims, 4 * embed_dims)
        sd[p + 'mlp.fc2.bias'] = (embed_dims, )
    sd['norm.weight'] = sd['norm.bias'] = (embed_dims, )
    if in21k:
        sd['pre_logits.fc.weight'] = (embed_dims, embed_dims)
        sd['pre_logits.fc.bias'] = (embed_dims, )
    sd['head.weight'] = (num_classes, embed_dims)
    sd['head.bias'] = (num_classes, )
    return sd


def _random_state(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return OrderedDict((k, torch.randn(s, generator=g)) for k, s in shapes.items())


def test_timm_r50_vit_b_384_loads_strictly_via_init_cfg(tmp_path):
    """Full-size vit_base_r50_s16_384 layout -> HybridViT (224) through init_cfg auto-detection:
    nothing missing, only the classifier unused (reported once), pos-embed 24x24 -> 14x14."""
    sd = _random_state(timm_hybrid_shapes())
    # stem 3, 16 bottlenecks x 9, 3 shortcuts x 3, proj/cls/pos 4, 12 blocks x 12, norm+head 4
    assert len(sd) == 3 + 16 * 9 + 3 * 3 + 4 + 12 * 12 + 4
    path = tmp_path / 'jx_vit_base_resnet50_384.pth'
    torch.save(dict(state_dict=sd), path)
    model = HybridViT(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model.init_weights()
    reports = [str(w.message) for w in caught if 'HybridViT' in str(w.message)]
    assert len(reports) == 1
    assert 'unused' in reports[0] and 'head.weight' in reports[0] and 'missing' not in reports[0]

    state = model.state_dict()
    converted, fmt = convert_hybrid_state_dict(sd)
    assert fmt == 'timm'
    missing = set(state) - set(converted)
    unexpected = set(converted) - set(state)
    assert missing == set() and unexpected == {'head.weight', 'head.bias'}
    cnn = 'patch_embed.backbone.'
    for key in (cnn + 'stem.conv.weight', cnn + 'stages.2.blocks.8.conv3.weight',
                cnn + 'stages.1.blocks.0.downsample.norm.bias', 'patch_embed.proj.weight',
                'cls_token', 'norm.weight', 'blocks.11.attn.qkv.weight'):
        assert torch.equal(state[key], sd[key]), key
    assert torch.equal(state['blocks.3.ffn.layers.0.0.weight'], sd['blocks.3.mlp.fc1.weight'])
    assert torch.equal(state['blocks.3.ffn.layers.1.bias'], sd['blocks.3.mlp.fc2.bias'])
    # pos-embed: CLS entry kept, the 24x24 grid resized to 14x14 as timm does on loading
    # (antialiased bicubic: the rule recorded with the timm format)
    pos = sd['pos_embed']
    grid = pos[:, 1:].reshape(1, 24, 24, 768).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(14, 14), mode='bicubic', align_corners=False,
                         antialias=True)
    expected = torch.cat([pos[:, :1], grid.flatten(2).transpose(1, 2)], dim=1)
    assert state['pos_embed'].shape == (1, 197, 768)
    torch.testing.assert_close(state['pos_embed'], expected, rtol=1e-5, atol=1e-5)
    model.eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 32, 48))
    assert all(torch.isfinite(o).all() for o in outs)


def test_timm_in21k_layout_and_our_own_layout():
    shapes = timm_hybrid_shapes(cnn_depths=(1, 1, 1), embed_dims=192, num_layers=2,
                                img_size=224, num_classes=21843, in21k=True)
    sd = _random_state(shapes)
    assert detect_hybrid_format(sd) == 'timm'
    model = HybridViT(**SMALL, out_channels=32)
    init_projs = {k: v.clone() for k, v in model.state_dict().items() if 'level_projs' in k}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        report = load_state_dict_reported(model, model.convert_checkpoint(sd))
    # the new pyramid projections keep their init and are not reported as missing
    assert report.missing == [] and len(caught) == 1 and len(init_projs) == 12
    for k, v in init_projs.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert torch.equal(model.state_dict()['blocks.1.ffn.layers.1.weight'],
                       sd['blocks.1.mlp.fc2.weight'])
    assert set(report.unexpected) == {'head.weight', 'head.bias', 'pre_logits.fc.weight',
                                      'pre_logits.fc.bias'}
    # the pyramid projections are new: our own file carries them and loads with nothing left
    ours = model.state_dict()
    assert detect_hybrid_format(ours) == 'mmvitswin'
    fresh = HybridViT(**SMALL, out_channels=32)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        report = load_state_dict_reported(fresh, fresh.convert_checkpoint(ours))
    assert report.missing == [] and report.unexpected == []
    model.eval(), fresh.eval()
    x = torch.randn(1, 3, 40, 40)
    with torch.no_grad():
        for a, b in zip(model(x), fresh(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_checkpoint_mismatch_errors():
    sd = _random_state(timm_hybrid_shapes(cnn_depths=(1, 1, 1), embed_dims=192, num_layers=2,
                                          img_size=224))
    with pytest.raises(ValueError, match='cnn_depths=\\(1, 1, 1\\)'):
        HybridViT(arch=SMALL['arch'], cnn_depths=(1, 2, 1)).convert_checkpoint(sd)
    plain_vit = OrderedDict((k, v) for k, v in sd.items() if not k.startswith('patch_embed.'))
    plain_vit['patch_embed.proj.weight'] = torch.zeros(192, 3, 16, 16)
    with pytest.raises(ValueError, match='not a hybrid'):
        detect_hybrid_format(plain_vit)
    with pytest.raises(ValueError, match='embed_dims=192'):
        HybridViT(arch=dict(SMALL['arch'], embed_dims=96), cnn_depths=(1, 1, 1)) \
            .convert_checkpoint(sd)

"""ViTAdapter behaviour: pyramid shapes in both adapter modes, gradients, freezing, windows,
checkpoint conversion details, registry use and input errors."""
import random

import pytest
import torch
import torch.nn.functional as F

from conftest import max_rel_err
from mmvitswin.core.checkpoint.vit import (adapt_vit_state_dict, convert_vit_state_dict,
                                      detect_vit_format, resample_patch_kernel)
from mmvitswin.core.backbones.vit import ViTAdapter, ViTBlock, VisionTransformerTrunk
from mmvitswin.core.layers import blocks_window_plan, window_plan

SMALL = dict(arch=dict(embed_dims=64, num_layers=4, num_heads=2, feedforward_channels=128),
             img_size=64)
ADAPTER_CFG = {'simple': dict(out_channels=32),
               'interaction': dict(conv_inplane=8, num_heads=2, n_points=2)}


def _sizes():
    rng = random.Random(5)
    return [(33, 65), (17, 45), (61, 96)] + [(rng.randint(20, 120), rng.randint(20, 120))
                                              for _ in range(3)]


def _model(adapter, **kwargs):
    cfg = dict(SMALL, adapter=adapter, adapter_cfg=ADAPTER_CFG.get(adapter), **kwargs)
    return ViTAdapter(**cfg)


@pytest.fixture(scope='module', params=['simple', 'interaction'])
def pyramid(request):
    torch.manual_seed(0)
    # windowed blocks (one global), rel pos and a CLS token: all paths at once
    model = _model(request.param, window_size=3, global_attn_indexes=(1, 3), use_rel_pos=True)
    return request.param, model.eval()


@pytest.mark.parametrize('hw', _sizes(), ids=str)
def test_pyramid_shapes_any_size(pyramid, hw):
    mode, model = pyramid
    with torch.no_grad():
        outs = model(torch.randn(2, 3, *hw))
    channels = 32 if mode == 'simple' else 64
    assert [tuple(o.shape) for o in outs] == [
        (2, channels, -(-hw[0] // s), -(-hw[1] // s)) for s in (4, 8, 16, 32)]
    assert all(torch.isfinite(o).all() for o in outs)


def test_pyramid_out_indices_select_levels():
    model = _model('simple', out_indices=(1, 3)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 50, 70))
    assert [tuple(o.shape[-2:]) for o in outs] == [(7, 9), (2, 3)]


def test_simple_pyramid_crop_is_padding_invariant():
    """Cropped levels of an odd-size input equal the same region of the model run on the input
    zero-padded by hand (the padding the backbone applies itself)."""
    model = _model('simple').eval()
    x = torch.randn(1, 3, 45, 70)
    with torch.no_grad():
        got = model(x)
        want = model(F.pad(x, (0, 26, 0, 19)))  # 64 x 96
    for g, w in zip(got, want):
        assert torch.allclose(g, w[..., :g.shape[-2], :g.shape[-1]], atol=1e-5)


@pytest.mark.parametrize('adapter', [None, 'simple', 'interaction'])
def test_backward_reaches_every_trainable_parameter(adapter):
    model = _model(adapter, window_size=3, use_rel_pos=True, drop_path_rate=0.1,
                   out_indices=(1, 3) if adapter is None else None)
    model.train()
    x = torch.randn(2, 3, 40, 56, requires_grad=True)
    sum(o.square().mean() for o in model(x)).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    # window blocks drop the CLS attention branch, but the CLS token still feeds global blocks
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing
    # rel-pos tables start at zero (ViTDet) but learn
    assert model.blocks[0].attn.rel_pos_h.grad.abs().sum() > 0


def test_frozen_stages_get_no_grad_and_stay_in_eval():
    model = _model('simple', frozen_stages=2, drop_rate=0.1)
    model.train()
    frozen = ['patch_embed', 'blocks.0', 'blocks.1']
    for name, m in model.named_modules():
        if any(name == f or name.startswith(f + '.') for f in frozen):
            assert not m.training, name
    assert model.blocks[2].training and model.adapter.training
    sum(o.sum() for o in model(torch.randn(1, 3, 64, 64))).backward()
    for name, p in model.named_parameters():
        is_frozen = name in ('cls_token', 'pos_embed') or any(
            name.startswith(f + '.') for f in frozen)
        assert p.requires_grad == (not is_frozen), name
        assert (p.grad is None) == is_frozen, name


def _kept_bytes(fn) -> int:
    """Bytes of the tensors autograd keeps for the backward while ``fn()`` runs."""
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(kept)


@pytest.mark.parametrize('adapter', ['simple', None])
def test_frozen_prefix_keeps_no_activations(adapter):
    """A frozen prefix runs without autograd: with the whole trunk frozen, a training forward
    keeps exactly what the pyramid alone keeps (nothing without one); frozen blocks 0-1 keep
    less than none frozen, and the same outputs come out."""
    torch.manual_seed(0)
    kw = dict(out_indices=(3, )) if adapter is None else {}
    x = torch.randn(1, 3, 64, 96)  # a multiple of 32: nothing padded
    kept, outs = {}, {}
    for frozen in (-1, 2, 4):
        torch.manual_seed(0)
        model = _model(adapter, frozen_stages=frozen, **kw).train()
        kept[frozen] = _kept_bytes(lambda: outs.setdefault(frozen, model(x)))
    with torch.no_grad():
        last = model.forward_intermediates(x)[-1]
    pyramid = 0 if adapter is None else _kept_bytes(lambda: model.adapter(last))
    assert kept[4] == pyramid
    assert pyramid < kept[2] < kept[-1]
    for frozen in (2, 4):
        for a, b in zip(outs[frozen], outs[-1]):
            assert torch.equal(a, b)


def test_with_cp_gives_same_values_and_grads():
    torch.manual_seed(0)
    a = _model('simple', window_size=3)
    b = _model('simple', window_size=3, with_cp=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 32, 48)
    outs = []
    for m in (a, b):
        out = m(x)
        sum(o.sum() for o in out).backward()
        outs.append(out)
    for oa, ob in zip(*outs):
        assert torch.allclose(oa, ob, atol=1e-6)
    assert torch.allclose(a.blocks[0].attn.qkv.weight.grad, b.blocks[0].attn.qkv.weight.grad,
                          atol=1e-5)


def test_drop_path_schedule_and_eval_determinism():
    model = _model(None, drop_path_rate=0.3)
    rates = [blk.drop_path.drop_prob for blk in model.blocks]
    assert rates == pytest.approx([0., 0.1, 0.2, 0.3])
    model.eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x)[0], model(x)[0])


# -------------------------------------------------------------------------------- windows
def test_window_covering_grid_equals_global_block():
    torch.manual_seed(0)
    glob = ViTBlock(32, 2, 64, window_size=0)
    win = ViTBlock(32, 2, 64, window_size=8)
    win.load_state_dict(glob.state_dict())
    # (a window bigger than the grid would add zero padding tokens to attend to, as ViTDet)
    x = torch.randn(2, 8 * 8, 32)
    assert torch.allclose(win(x, (8, 8)), glob(x, (8, 8)), atol=1e-5)


def test_windows_are_independent_and_cls_skips_attention():
    torch.manual_seed(0)
    block = ViTBlock(32, 2, 64, window_size=3).eval()
    x = torch.randn(1, 1 + 5 * 7, 32)  # CLS + 5 x 7 grid (padded to 6 x 9: windows 2 x 3)
    base = block(x, (5, 7), num_prefix=1)
    y = x.clone()
    y[:, 1 + 0 * 7 + 0] += torch.randn(32)  # token (0, 0): in window (0, 0) = rows 0-2, cols 0-2
    out = block(y, (5, 7), num_prefix=1)
    changed = (out - base).abs().amax(-1)[0, 1:].reshape(5, 7) > 1e-6
    expected = torch.zeros(5, 7, dtype=torch.bool)
    expected[:3, :3] = True
    assert torch.equal(changed, expected)
    # the CLS token only goes through the FFN in a windowed block
    assert torch.allclose(out[:, 0], base[:, 0])
    want_cls = x[:, 0] + block.ffn(block.norm2(x[:, 0]))
    assert torch.allclose(base[:, 0], want_cls, atol=1e-6)


@pytest.mark.parametrize('adapter', [None, 'simple', 'interaction'])
def test_windowed_blocks_share_one_window_plan_per_forward(adapter):
    """The trunk (and the interaction adapter, which runs the trunk's blocks) builds the window
    plan of the token grid once per forward for all its windowed blocks: one ``scatter`` (the
    plan's inverse index) per forward, however many blocks are windowed, and the same maps as
    blocks that each build their own."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.scatters = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.scatters += func.overloadpacket is torch.ops.aten.scatter
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = _model(adapter, window_size=3, global_attn_indexes=(3, ), use_rel_pos=True).eval()
    assert sum(block.window_size > 0 for block in model.blocks) == 3
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad(), Count() as count:
        shared = model(x)
    assert count.scatters == 1
    with torch.no_grad():  # against blocks that each build their own plan: the same values
        seq, grid = model.prepare_tokens(x)
        plan = blocks_window_plan(model.blocks, grid, seq.device)
        ref = seq
        for block in model.blocks:
            seq = block(seq, grid, model.num_prefix_tokens, plan)
            ref = block(ref, grid, model.num_prefix_tokens)
        assert torch.equal(seq, ref)
    assert all(torch.isfinite(m).all() for m in shared)


def test_window_plan_of_another_window_is_refused():
    block = ViTBlock(32, 2, 64, window_size=3)
    plan = window_plan((5, 7), (4, 4), (0, 0), torch.device('cpu'))
    with pytest.raises(ValueError, match=r'plan is for windows of \(4, 4\)'):
        block(torch.randn(1, 35, 32), (5, 7), 0, plan)
    with pytest.raises(ValueError, match=r'share one window_size, got \[3, 4\]'):
        blocks_window_plan([block, ViTBlock(32, 2, 64, window_size=4)], (5, 7), 'cpu')
    assert blocks_window_plan([ViTBlock(32, 2, 64)], (5, 7), 'cpu') is None


def test_default_global_blocks_vitdet():
    model = VisionTransformerTrunk('tiny', window_size=14)
    assert [blk.window_size for blk in model.blocks] == [14, 14, 0] * 4


# ---------------------------------------------------------------------------- checkpoints
def test_patch_kernel_resample_preserves_tokens():
    """Upsampling the kernel 8 -> 16: the new kernel on the bicubically upsampled patch gives
    the token the old kernel gives on the original patch."""
    w = torch.randn(5, 3, 8, 8)
    patch = torch.randn(2, 3, 8, 8)
    big = F.interpolate(patch, size=(16, 16), mode='bicubic', align_corners=False)
    w16 = resample_patch_kernel(w, (16, 16))
    assert w16.shape == (5, 3, 16, 16)
    assert max_rel_err(F.conv2d(big, w16), F.conv2d(patch, w)) < 1e-4


def test_deit_and_mae_layouts():
    """DeiT: dist_token and its pos-embed entry dropped; 16 -> 8 px patches resampled, the
    14 x 14 grid resized; MAE-style fc_norm kept for the loader to report."""
    model = ViTAdapter(arch=dict(embed_dims=32, num_layers=1, num_heads=2,
                                 feedforward_channels=64), patch_size=8, img_size=64)
    pos = torch.randn(1, 2 + 14 * 14, 32)
    sd = {'cls_token': torch.randn(1, 1, 32), 'dist_token': torch.randn(1, 1, 32),
          'pos_embed': pos, 'patch_embed.proj.weight': torch.randn(32, 3, 16, 16),
          'patch_embed.proj.bias': torch.zeros(32), 'blocks.0.mlp.fc1.weight': torch.zeros(64, 32),
          'fc_norm.weight': torch.ones(32)}
    conv, fmt = convert_vit_state_dict(sd)
    assert fmt == 'timm' and 'dist_token' not in conv and 'blocks.0.ffn.layers.0.0.weight' in conv
    out = adapt_vit_state_dict(conv, model)
    assert out['pos_embed'].shape == (1, 1 + 8 * 8, 32)
    assert torch.equal(out['pos_embed'][:, 0], pos[:, 0])  # CLS kept, dist dropped
    assert out['patch_embed.proj.weight'].shape == (32, 3, 8, 8)
    assert 'fc_norm.weight' in out


def test_format_detection_and_errors():
    assert detect_vit_format({'layers.0.attn.attn.in_proj_weight': 0}) == 'mmseg'
    assert detect_vit_format({'layers.0.attn.qkv.weight': 0}) == 'mmpretrain'
    assert detect_vit_format({'blocks.0.attn.qkv.weight': 0}) == 'timm'
    assert detect_vit_format({'blocks.0.ffn.layers.1.weight': 0}) == 'mmvitswin'
    with pytest.raises(ValueError, match='unrecognised ViT checkpoint'):
        detect_vit_format({'stages.0.blocks.0.attn.w_msa.qkv.weight': 0})
    small = ViTAdapter(**SMALL)
    big = ViTAdapter('tiny', num_layers=4)
    with pytest.raises(ValueError, match='embed_dims=192'):
        small.convert_checkpoint(big.state_dict())
    from mmvitswin.core.checkpoint import load_state_dict_reported
    sd = small.convert_checkpoint(ViTAdapter(**SMALL).state_dict())
    assert load_state_dict_reported(small, sd) == ([], [])


def test_released_vit_adapter_keys_move_under_adapter():
    model = _model('interaction')
    ours = model.state_dict()
    release = {}
    for k, v in ours.items():  # the original ViT-Adapter layout: timm blocks, adapter on top
        k = k.replace('ffn.layers.0.0.', 'mlp.fc1.').replace('ffn.layers.1.', 'mlp.fc2.')
        release[k[len('adapter.'):] if k.startswith('adapter.') else k] = v
    assert 'spm.stem.0.weight' in release and 'norm1.weight' in release
    converted = model.convert_checkpoint(release)
    assert set(converted) == set(ours)


def test_rel_pos_tables_resized_on_load():
    src = _model(None, window_size=4, use_rel_pos=True, global_attn_indexes=(1, ))
    dst = _model(None, window_size=6, use_rel_pos=True, global_attn_indexes=(1, ))
    sd = dst.convert_checkpoint(src.state_dict())
    assert sd['blocks.0.attn.rel_pos_h'].shape == (11, 32)
    assert sd['blocks.1.attn.rel_pos_h'].shape == (7, 32)  # global: 2 * 64/16 - 1


def test_conv_stem_model_loads_a_patchify_checkpoint_except_the_stem():
    from mmvitswin.core.checkpoint.loading import load_state_dict_reported
    src = _model(None).state_dict()
    dst = _model(None, stem='conv')
    stem_before = {k: v.clone() for k, v in dst.patch_embed.state_dict().items()}
    with pytest.warns(UserWarning, match='conv stem'):
        report = load_state_dict_reported(dst, dst.convert_checkpoint(src))
    assert 'patch_embed.proj.weight' in report.missing and not report.unexpected
    for k, v in dst.patch_embed.state_dict().items():
        assert torch.equal(v, stem_before[k]), k
    own = dst.state_dict()
    for k, v in src.items():
        if not k.startswith('patch_embed.'):
            assert torch.equal(own[k], v), k


# ------------------------------------------------------------------------------ registry
def test_built_from_mmdet_and_mmseg_registries():
    import mmvitswin  # noqa: F401
    from mmdet.registry import MODELS as DET
    from mmseg.registry import MODELS as SEG
    from mmvitswin.openmmlab.models import ViTAdapter as Registered
    assert issubclass(Registered, ViTAdapter)
    for registry in (DET, SEG):
        m = registry.build(dict(type='ViTAdapter', adapter='simple', **SMALL))
        assert type(m) is Registered


# -------------------------------------------------------------------------------- errors
@pytest.mark.parametrize('kwargs, exc, match', [
    (dict(adapter='fpn'), ValueError, 'adapter must be'),
    (dict(adapter='simple', patch_size=48, img_size=96), ValueError, 'needs patch_size <= 32'),
    (dict(adapter='simple', out_indices=(4, )), ValueError, 'pyramid levels'),
    (dict(adapter='simple', adapter_cfg=dict(channels=3)), ValueError, 'out_channels only'),
    (dict(out_indices=(7, )), ValueError, 'out_indices'),
    (dict(window_size=-1), ValueError, 'window_size'),
    (dict(window_size=4, global_attn_indexes=(9, )), ValueError, 'global_attn_indexes'),
    (dict(arch='gigantic'), ValueError, 'arch must be one of'),
    (dict(arch=dict(embed_dims=64, num_layers=2, num_heads=3, feedforward_channels=8)),
     ValueError, 'divisible'),
    (dict(frozen_stages=9), ValueError, 'frozen_stages'),
    (dict(drop_path_rate=1.5), ValueError, 'drop_path_rate'),
    (dict(patch_embed='conv'), TypeError, 'patch_embed'),
    (dict(stem='resnet'), ValueError, "stem must be 'patch'"),
    (dict(stem='conv', patch_embed=torch.nn.Identity()), ValueError, 'exclude each other'),
    (dict(adapter='interaction', adapter_cfg=dict(interaction_indexes=[(0, 2)])), ValueError,
     'end at num_layers'),
])
def test_constructor_errors(kwargs, exc, match):
    cfg = dict(SMALL)
    cfg.update(kwargs)
    with pytest.raises(exc, match=match):
        ViTAdapter(**cfg)


@pytest.mark.parametrize('x, exc, match', [
    (torch.randn(3, 32, 32), ValueError, '4-D'),
    (torch.randn(1, 1, 32, 32), ValueError, 'in_channels=3'),
    (torch.zeros(1, 3, 32, 32, dtype=torch.long), TypeError, 'floating'),
    ([1, 2], TypeError, 'torch.Tensor'),
])
def test_forward_input_errors(x, exc, match):
    model = _model('simple')
    with pytest.raises(exc, match=match):
        model(x)


def test_replacement_patch_embed_is_used():
    """The hybrid hook: any module returning (B, h, w, C) tokens and the grid."""

    class Stem(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 64, 16, stride=16)

        def forward(self, x):
            y = self.conv(x)
            return y.permute(0, 2, 3, 1), tuple(y.shape[-2:])

    model = ViTAdapter(patch_embed=Stem(), adapter='simple', **SMALL)
    assert model.get_layer_depth('patch_embed.conv.weight') == 0
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 96))
    assert outs[0].shape == (1, 256, 16, 24)


@pytest.mark.slow(reason='a training step of a whole Mask R-CNN')
@pytest.mark.parametrize('mode', ['simple', 'interaction'])
def test_demo_mask_rcnn_trains_one_step(mode):
    """The demo config builds in mmdet's scope, with the layer-decay constructor, and one
    optimisation step on a batch of odd-size images runs and changes the trunk."""
    import mmvitswin  # noqa: F401
    from mmdet.registry import MODELS as DET
    from mmdet.testing import demo_mm_inputs
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = Config.fromfile(
        os.path.join(root, 'configs', 'demo', f'mask_rcnn_vit_adapter_{mode}_shapes.py'))
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = DET.build(cfg.model)
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    assert isinstance(model.backbone, ViTAdapter) and model.backbone.adapter_type == mode
    data = demo_mm_inputs(2, image_shapes=[(3, 97, 123), (3, 128, 90)], num_items=[3, 2],
                          num_classes=4, with_mask=True)
    data = model.data_preprocessor(data, True)
    before = model.backbone.blocks[0].attn.qkv.weight.detach().clone()
    losses = model.loss(data['inputs'], data['data_samples'])
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    wrapper.update_params(loss)
    assert not torch.equal(before, model.backbone.blocks[0].attn.qkv.weight)


@pytest.mark.parametrize('patch', [8, 16])
def test_simple_pyramid_from_stride_8_and_16(patch):
    from mmvitswin.core.backbones.vit import SimpleFeaturePyramid, ViTAdapter
    sfp = SimpleFeaturePyramid(32, 8, in_stride=patch)
    x = torch.randn(2, 32, 8, 12)  # a stride-`patch` map
    outs = sfp(x)
    assert [tuple(o.shape[2:]) for o in outs] == [(8 * patch // s, 12 * patch // s)
                                                   for s in (4, 8, 16, 32)]
    # the level at the input stride is the identity before its output head
    same = (4, 8, 16, 32).index(patch)
    assert isinstance(sfp.rescale[same], torch.nn.Identity)
    model = ViTAdapter(arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                 feedforward_channels=64), img_size=64, patch_size=patch,
                       adapter='simple', adapter_cfg=dict(out_channels=8))
    outs = model(torch.randn(1, 3, 45, 71))
    assert [tuple(o.shape[2:]) for o in outs] == [(-(-45 // s), -(-71 // s))
                                                   for s in (4, 8, 16, 32)]
    sum(o.sum() for o in outs).backward()

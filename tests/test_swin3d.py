"""Video Swin (SwinTransformer3D): parity with mmaction2 1.2, checkpoints, inflation, behaviour.

mmaction2's ``models/backbones/swin.py`` is loaded from its file path: ``import mmaction.models``
fails with the 1.2.0 wheel (no ``localizers/drn``), and these tests must not depend on it.
"""
import importlib.util
import os
import re
from collections import OrderedDict

import pytest
import torch

from conftest import max_rel_err
from mmvitswin.core.checkpoint import (detect_swin3d_format, load_pretrained,
                                  microsoft_order_from_unfold)
from mmvitswin.core.backbones.swin import SwinTransformer
from mmvitswin.core.backbones.swin3d import SwinTransformer3D

SMALL = dict(embed_dims=32, depths=[1, 2, 1, 1], num_heads=[1, 2, 4, 8])


@pytest.fixture(scope='module')
def mma():
    """mmaction2 1.2's video Swin module, loaded from its file without ``mmaction.models``."""
    import mmaction
    import mmaction.registry
    path = os.path.join(os.path.dirname(mmaction.__file__), 'models', 'backbones', 'swin.py')
    spec = importlib.util.spec_from_file_location('_mmaction_swin3d_reference', path)
    module = importlib.util.module_from_spec(spec)
    # Its decorator registers 'SwinTransformer3D' with force=False, where ours already is.
    registry = mmaction.registry.MODELS.module_dict
    ours = registry.pop('SwinTransformer3D', None)
    try:
        spec.loader.exec_module(module)
    finally:
        registry.pop('SwinTransformer3D', None)
        if ours is not None:
            registry['SwinTransformer3D'] = ours
    return module


def _perturb(model: torch.nn.Module, scale: float = 0.02) -> None:
    """Move every parameter off its init (LayerNorm 1/0, zero biases) so all of them matter."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out, )


def _reference_pair(mma, **kwargs):
    ref = mma.SwinTransformer3D(pretrained2d=False, **kwargs)
    ref.eval()  # mmaction2's train() returns None
    _perturb(ref)
    ours = SwinTransformer3D(**kwargs).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)  # identical keys, no conversion
    return ref, ours


# ----------------------------------------------------------------------- (1) mmaction2 parity
@pytest.mark.slow(reason='Video Swin-T parity with mmaction2')
@pytest.mark.parametrize('kwargs,shape', [
    (dict(arch='tiny'), (1, 3, 8, 224, 224)),
    # reduced depth for speed; T=5 pads in the patch embedding and clamps the temporal window
    (dict(arch=SMALL, out_indices=(0, 1, 2, 3)), (2, 3, 5, 97, 131)),
    (dict(arch=SMALL, out_indices=(0, 1, 2, 3), out_after_downsample=True,
          window_size=(2, 3, 3), patch_size=(1, 4, 4)), (2, 3, 9, 61, 45)),
], ids=['tiny_8x224', 'small_5x97x131', 'after_downsample_9x61x45'])
def test_outputs_match_mmaction2(mma, kwargs, shape):
    ref, ours = _reference_pair(mma, **kwargs)
    x = torch.randn(shape)
    with torch.no_grad():
        expected, got = ref(x), ours(x)
    # one stage -> a tensor, several -> a tuple, as mmaction2
    assert isinstance(got, torch.Tensor) == isinstance(expected, torch.Tensor)
    expected, got = _as_tuple(expected), _as_tuple(got)
    assert len(got) == len(expected) == len(kwargs.get('out_indices', (3, )))
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        assert (g - e).abs().max() < 1e-5
        assert max_rel_err(g, e) < 1e-5


def test_state_dict_stochastic_depth_and_freezing_match_mmaction2(mma):
    kwargs = dict(arch=SMALL, drop_path_rate=0.3, frozen_stages=2, out_indices=(1, 3))
    ref = mma.SwinTransformer3D(pretrained2d=False, **kwargs)
    ref.train()
    ours = SwinTransformer3D(**kwargs).train()
    ref_sd, our_sd = ref.state_dict(), ours.state_dict()
    assert set(our_sd) == set(ref_sd)
    assert all(our_sd[k].shape == ref_sd[k].shape for k in ref_sd)
    assert torch.equal(our_sd['layers.0.blocks.0.attn.relative_position_index'],
                       ref_sd['layers.0.blocks.0.attn.relative_position_index'])
    ref_rates = [float(getattr(b.drop_path, 'drop_prob', 0.)) for layer in ref.layers
                 for b in layer.blocks]
    our_rates = [b.drop_path.drop_prob for layer in ours.layers for b in layer.blocks]
    assert our_rates == pytest.approx(ref_rates, abs=1e-6)
    ref_frozen = {n for n, p in ref.named_parameters() if not p.requires_grad}
    our_frozen = {n for n, p in ours.named_parameters() if not p.requires_grad}
    assert our_frozen == ref_frozen and our_frozen
    assert not ours.layers[1].training and ours.layers[2].training


# --------------------------------------------------------------------------- checkpoints
def _save(obj, tmp_path, name):
    path = str(tmp_path / name)
    torch.save(obj, path)
    return path


@pytest.mark.parametrize('wrap', ['bare', 'recognizer', 'runner'])
def test_mmaction2_checkpoints_load_strictly(mma, tmp_path, wrap, recwarn):
    ref, _ = _reference_pair(mma, arch=SMALL)
    sd = ref.state_dict()
    if wrap == 'recognizer':  # a whole Recognizer3D: backbone. prefix plus a head
        sd = OrderedDict([('backbone.' + k, v) for k, v in sd.items()] +
                         [('cls_head.fc_cls.weight', torch.zeros(400, 256))])
    obj = {'meta': {}, 'state_dict': sd} if wrap == 'runner' else sd
    path = _save(obj, tmp_path, 'video.pth')
    model = SwinTransformer3D(arch=SMALL)
    report = load_pretrained(model, path)
    assert report.missing == [] and report.unexpected == []
    assert not [w for w in recwarn if 'SwinTransformer3D' in str(w.message)]
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    # the same through the constructor, as mmaction2 configs write it
    built = SwinTransformer3D(arch=SMALL, pretrained=path, pretrained2d=False)
    built.init_weights()
    assert torch.equal(built.norm3.weight, ref.norm3.weight)


def test_3d_table_resized_along_time(tmp_path):
    src = SwinTransformer3D(arch=SMALL, window_size=(2, 3, 3))
    with torch.no_grad():  # a bias that ignores time must keep ignoring it at another Wt
        for layer in src.layers:
            for block in layer.blocks:
                t = block.attn.relative_position_bias_table
                t.copy_(t.view(3, 25, -1)[:1].expand(3, 25, t.shape[1]).reshape_as(t))
    path = _save(src.state_dict(), tmp_path, 'wt2.pth')
    dst = SwinTransformer3D(arch=SMALL, window_size=(4, 3, 3))
    report = load_pretrained(dst, path)
    assert report.missing == [] and report.unexpected == []
    got = dst.layers[2].blocks[0].attn.relative_position_bias_table.view(7, 25, -1)
    want = src.layers[2].blocks[0].attn.relative_position_bias_table.view(3, 25, -1)[0]
    assert torch.allclose(got, want.expand_as(got), atol=1e-6)


def test_bad_checkpoints_raise(tmp_path):
    with pytest.raises(ValueError, match='patch embedding'):
        detect_swin3d_format({'foo.weight': torch.zeros(1)})
    other = SwinTransformer3D(arch=dict(embed_dims=16, depths=[1, 1], num_heads=[1, 2]),
                              out_indices=(1, ))
    path = _save(other.state_dict(), tmp_path, 'other.pth')
    with pytest.raises(ValueError, match='embed_dims=16'):
        load_pretrained(SwinTransformer3D(arch=SMALL), path)


# ------------------------------------------------------------------------- (2) inflation
SWIN2D = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))


def _unfold_to_microsoft_perm(c: int) -> torch.Tensor:
    """Index map for the merged 4C vector: Microsoft slot k*C + ch holds neighbour
    k in [(dy, dx)] = [(0, 0), (1, 0), (0, 1), (1, 1)]; nn.Unfold's slot is ch*4 + dy*2 + dx."""
    perm = []
    for dy, dx in [(0, 0), (1, 0), (0, 1), (1, 1)]:
        for ch in range(c):
            perm.append(ch * 4 + dy * 2 + dx)
    return torch.tensor(perm)


def _mmdet_to_microsoft(sd):
    """A 2-D Swin in our (mmdet) layout -> the Microsoft release layout, written independently
    of the package (checked against mmdet's own swin_converter below)."""
    out = OrderedDict()
    for k, v in sd.items():
        if k.endswith('relative_position_index') or re.match(r'norm\d', k):
            continue
        nk = k.replace('patch_embed.projection.', 'patch_embed.proj.')
        nk = nk.replace('stages.', 'layers.').replace('attn.w_msa.', 'attn.')
        nk = nk.replace('ffn.layers.0.0.', 'mlp.fc1.').replace('ffn.layers.1.', 'mlp.fc2.')
        if '.downsample.' in k:
            v = v[..., _unfold_to_microsoft_perm(v.shape[-1] // 4)]
        out[nk] = v
    out['norm.weight'], out['norm.bias'] = sd['norm3.weight'], sd['norm3.bias']
    out['head.weight'], out['head.bias'] = torch.randn(10, 128), torch.randn(10)
    return out


@pytest.fixture(scope='module')
def swin2d():
    torch.manual_seed(1)
    model = SwinTransformer(arch=SWIN2D, window_size=3, drop_path_rate=0.).eval()
    _perturb(model, 0.05)
    return model


def test_test_oracle_matches_mmdet_converter(swin2d):
    from mmdet.models.backbones.swin import swin_converter
    ours = swin2d.state_dict()
    back = swin_converter(_mmdet_to_microsoft(ours))
    for k, v in back.items():
        k = k[len('backbone.'):]
        if k in ours:
            assert torch.equal(v, ours[k]), k
    assert microsoft_order_from_unfold(ours['stages.0.downsample.reduction.weight']).equal(
        _mmdet_to_microsoft(ours)['layers.0.downsample.reduction.weight'])


@pytest.mark.parametrize('fmt', ['mmdet', 'microsoft'])
def test_inflated_static_clip_equals_2d_per_frame(swin2d, tmp_path, fmt):
    """T=8 identical frames, patch (2, 4, 4) -> 4 time steps; window (2, 3, 3) divides them, so
    no temporal padding enters any window while the shifted blocks still roll over time. The
    spatial grids (32, 16, 8, 4) all exceed the 3x3 window, so neither model clamps it."""
    sd = swin2d.state_dict()
    path = _save({'model': _mmdet_to_microsoft(sd)} if fmt == 'microsoft' else sd, tmp_path,
                 f'{fmt}.pth')
    video = SwinTransformer3D(arch=SWIN2D, window_size=(2, 3, 3), patch_size=(2, 4, 4),
                              out_indices=(0, 1, 2, 3) if fmt == 'mmdet' else (3, ))
    if fmt == 'microsoft':  # the classification head has no 3-D counterpart: one warning
        with pytest.warns(UserWarning, match='unused from .*head.weight'):
            report = load_pretrained(video, path)
    else:
        report = load_pretrained(video, path)
    assert report.missing == []
    assert sorted(report.unexpected) == ([] if fmt == 'mmdet' else ['head.bias', 'head.weight'])
    video.eval()
    frame = torch.randn(1, 3, 128, 128)
    clip = frame.unsqueeze(2).expand(1, 3, 8, 128, 128)
    with torch.no_grad():
        per_frame = swin2d(frame)
        got = _as_tuple(video(clip))
    if fmt == 'microsoft':
        per_frame = per_frame[3:]  # the ImageNet ``norm`` is the last stage's norm
    for g, f in zip(got, per_frame):
        assert g.shape[2] == 4
        for t in range(g.shape[2]):
            assert max_rel_err(g[:, :, t], f) < 1e-4
            assert (g[:, :, t] - f).abs().max() < 1e-4
    if fmt == 'mmdet':  # control: 3 time steps pad the 2-frame windows with zeros -> differs
        with torch.no_grad():
            padded = video(clip[:, :, :6])
        assert (padded[0][:, :, -1] - per_frame[0]).abs().max() > 1e-3


def test_inflation_matches_mmaction2_inflate_weights(mma, swin2d, tmp_path):
    """Against mmaction2's own inflate_weights, with a window change (3 -> 5, bicubic) too."""
    path = _save({'model': _mmdet_to_microsoft(swin2d.state_dict())}, tmp_path, 'ms.pth')
    kwargs = dict(arch=SWIN2D, window_size=(3, 5, 5), patch_size=(2, 4, 4))
    ref = mma.SwinTransformer3D(pretrained=path, pretrained2d=True, **kwargs)
    ref.init_weights()
    ours = SwinTransformer3D(pretrained=path, **kwargs)
    with pytest.warns(UserWarning, match='head.weight'):
        ours.init_weights()
    ref_sd = ref.state_dict()
    for k, v in ours.state_dict().items():
        assert torch.allclose(v, ref_sd[k], atol=1e-6), k


# ------------------------------------------------------------------------- (3) behaviour
@pytest.mark.parametrize('t,h,w', [(1, 1, 1), (3, 33, 17), (7, 45, 29), (16, 40, 64)])
def test_output_shapes_any_size(t, h, w):
    model = SwinTransformer3D(arch=SMALL, window_size=(4, 5, 5), out_indices=(0, 1, 2, 3)).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, t, h, w))
    tp, hp, wp = -(-t // 2), -(-h // 4), -(-w // 4)
    for i, out in enumerate(outs):
        assert out.shape == (1, 32 * 2**i, tp, hp, wp)
        hp, wp = -(-hp // 2), -(-wp // 2)
    assert all(torch.isfinite(o).all() for o in outs)


def test_random_sizes_and_batch_independence():
    model = SwinTransformer3D(arch=SMALL, window_size=(2, 3, 3)).eval()
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        t, h, w = (int(v) for v in torch.randint(1, 25, (3, ), generator=gen))
        x = torch.randn(2, 3, t, h, w)
        with torch.no_grad():
            both, first = model(x), model(x[:1])
        assert both.shape == (2, 256, -(-t // 2), -(-h // 32), -(-w // 32))
        assert torch.allclose(both[:1], first, atol=1e-5)


def test_backward_frozen_stages_and_checkpointing():
    torch.manual_seed(0)
    kwargs = dict(arch=SMALL, window_size=(2, 3, 3), out_indices=(0, 1, 2, 3), frozen_stages=1,
                  drop_path_rate=0.)
    plain = SwinTransformer3D(**kwargs).train()
    cp = SwinTransformer3D(with_cp=True, **kwargs).train()
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 4, 24, 28)
    losses = []
    for model in (plain, cp):
        losses.append(sum(o.square().mean() for o in model(x.clone().requires_grad_())))
        losses[-1].backward()
    assert torch.allclose(losses[0], losses[1], atol=1e-6)
    for (name, p), q in zip(plain.named_parameters(), cp.parameters()):
        frozen = name.startswith(('patch_embed.', 'layers.0.'))
        assert p.requires_grad != frozen, name
        if frozen:
            assert p.grad is None, name
        else:
            assert p.grad is not None and torch.allclose(p.grad, q.grad, atol=1e-5), name
    assert plain.layers[1].blocks[1].attn.relative_position_bias_table.grad.abs().sum() > 0
    assert not plain.patch_embed.training and not plain.layers[0].training
    assert plain.eval() is plain and not plain.layers[3].training


def test_registered_for_mmvitswin_and_mmaction2():
    from mmengine.registry import DefaultScope
    import mmaction.registry
    from mmvitswin.openmmlab.models import SwinTransformer3D as Registered
    from mmvitswin.openmmlab.registry import MODELS
    assert issubclass(Registered, SwinTransformer3D)
    assert mmaction.registry.MODELS.module_dict['SwinTransformer3D'] is Registered
    with DefaultScope.overwrite_default_scope('mmdet'):
        from mmdet.registry import MODELS as DET
        m = DET.build(dict(type='mmvitswin.SwinTransformer3D', arch=SMALL))
    assert type(m) is Registered
    assert MODELS.get('SwinTransformer3D') is Registered


def test_mmaction2_failures_never_break_the_bridge(monkeypatch):
    import mmaction.registry
    from mmvitswin.openmmlab import registry
    from mmvitswin.openmmlab.models import SwinTransformer3D as Registered

    class NoMMAction:
        @staticmethod
        def import_module(name):
            raise ModuleNotFoundError(name)

    monkeypatch.setattr(registry, 'importlib', NoMMAction)
    assert registry.bridge_to_mmaction() is False

    class BrokenModels:  # the 1.2.0 wheel: registry imports, models does not
        @staticmethod
        def import_module(name):
            if name == 'mmaction.models':
                raise ModuleNotFoundError("No module named 'mmaction.models.localizers.drn'")
            return mmaction.registry

    monkeypatch.setattr(registry, 'importlib', BrokenModels)
    monkeypatch.setattr(mmaction.registry.MODELS, '_imported', False)
    monkeypatch.setitem(mmaction.registry.MODELS.module_dict, 'SwinTransformer3D', object)
    assert registry.bridge_to_mmaction() is True
    assert mmaction.registry.MODELS.module_dict['SwinTransformer3D'] is Registered
    assert mmaction.registry.MODELS._imported is False  # its own import error stays visible


@pytest.mark.parametrize('bad,exc,match', [
    (torch.randn(1, 3, 32, 32), ValueError, r'5-D \(B, C, T, H, W\)'),
    (torch.randn(1, 4, 2, 32, 32), ValueError, 'in_channels=3'),
    (torch.zeros(1, 3, 2, 32, 32, dtype=torch.long), TypeError, 'floating-point'),
    ([[0.]], TypeError, 'torch.Tensor'),
])
def test_bad_input_raises(bad, exc, match):
    model = SwinTransformer3D(arch=SMALL)
    with pytest.raises(exc, match=match):
        model(bad)


@pytest.mark.parametrize('kwargs,exc,match', [
    (dict(arch='huge'), ValueError, 'arch must be one of'),
    (dict(arch=dict(embed_dims=32, depths=[1, 1])), ValueError, 'missing'),
    (dict(out_indices=(4, )), ValueError, 'out_indices'),
    (dict(frozen_stages=5), ValueError, 'frozen_stages'),
    (dict(window_size=(8, 7)), IndexError, 'window_size'),
    (dict(patch_size=(2, 0, 4)), ValueError, 'patch_size'),
    (dict(arch=dict(embed_dims=30, depths=[1], num_heads=[4])), ValueError, 'divisible'),
    (dict(pretrained=3), TypeError, 'pretrained'),
])
def test_bad_config_raises(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SwinTransformer3D(**kwargs)

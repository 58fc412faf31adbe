"""SwinTransformer behaviour: shapes, presets, freezing, checkpointing, input validation."""
import math

import pytest
import torch

from mmvitswin.core.backbones.swin import SwinTransformer
from conftest import max_rel_err

# Swin-T's layout (4 stages, shifted windows, patch merging) at a quarter of its width: enough
# for tests that check shapes, freezing and errors rather than values.
NARROW = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
NARROW_DIMS = [32, 64, 128, 256]


def _expected_hw(h, w, patch=4):
    hs, ws = math.ceil(h / patch), math.ceil(w / patch)
    out = []
    for _ in range(4):
        out.append((hs, ws))
        hs, ws = math.ceil(hs / 2), math.ceil(ws / 2)
    return out


@pytest.mark.parametrize('hw', [(1, 1), (5, 3), (31, 97), (64, 64), (130, 61)])
def test_any_size_follows_the_output_rule(hw):
    model = SwinTransformer(out_indices=(0, 1, 2, 3), **NARROW).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *hw))
    assert [tuple(o.shape[2:]) for o in outs] == _expected_hw(*hw)
    assert [o.shape[1] for o in outs] == NARROW_DIMS
    assert all(torch.isfinite(o).all() for o in outs)


def test_arch_presets_and_overrides():
    """The presets are read, not built: only the override case builds, at a small width."""
    from mmvitswin.core.backbones.swin import ARCH_ALIASES, ARCH_ZOO, SWIN_ARCH_KEYS
    from mmvitswin.core.layers import resolve_arch
    for arch, dims, depths, heads in [('tiny', 96, (2, 2, 6, 2), (3, 6, 12, 24)),
                                      ('small', 96, (2, 2, 18, 2), (3, 6, 12, 24)),
                                      ('base', 128, (2, 2, 18, 2), (4, 8, 16, 32)),
                                      ('large', 192, (2, 2, 18, 2), (6, 12, 24, 48))]:
        for name in (arch, arch[0], arch.upper()):
            preset = resolve_arch(name, ARCH_ZOO, ARCH_ALIASES, SWIN_ARCH_KEYS)
            assert (preset['embed_dims'], tuple(preset['depths']),
                    tuple(preset['num_heads'])) == (dims, depths, heads)
    m = SwinTransformer(arch='base', depths=(1, 1, 1, 1), embed_dims=64, num_heads=(2, 4, 8, 16))
    assert (m.num_features[0], m.depths, m.num_heads) == (64, (1, 1, 1, 1), (2, 4, 8, 16))
    assert len(m.stages[2].blocks) == 1


def test_out_indices_subset():
    m = SwinTransformer(out_indices=(1, 3), **NARROW).eval()
    outs = m(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [NARROW_DIMS[1], NARROW_DIMS[3]]
    assert not hasattr(m, 'norm0')


def test_train_returns_self_and_keeps_frozen_stages_in_eval():
    m = SwinTransformer(frozen_stages=2, drop_path_rate=0., **NARROW)
    assert m.train() is m
    frozen = [m.patch_embed, m.stages[0], m.stages[1], m.norm0, m.norm1]
    for mod in frozen:
        assert not mod.training
        assert all(not p.requires_grad for p in mod.parameters())
    assert m.stages[2].training and all(p.requires_grad for p in m.stages[2].parameters())
    outs = m(torch.randn(1, 3, 64, 64))
    sum(o.sum() for o in outs).backward()
    for mod in frozen:
        assert all(p.grad is None for p in mod.parameters())
    assert m.stages[2].blocks[0].ffn.layers[1].weight.grad is not None


@pytest.mark.slow(reason='mmdet Swin-T built side by side')
def test_frozen_stages_match_mmdet_definition():
    from mmdet.models.backbones.swin import SwinTransformer as Ref
    for k in range(-1, 5):
        ours = SwinTransformer(frozen_stages=k)
        ref = Ref(frozen_stages=k)
        ours.train()
        ref.train()
        want = {n for n, p in ref.named_parameters() if not p.requires_grad}
        got = {n for n, p in ours.named_parameters() if not p.requires_grad}
        assert got == want, k


@pytest.mark.slow(reason='Swin-T forward-backward with and without activation checkpointing')
def test_with_cp_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = SwinTransformer(drop_path_rate=0.)
    cp = SwinTransformer(drop_path_rate=0., with_cp=True)
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 72, 56)
    for m in (plain, cp):
        m.train()
        sum(o.square().mean() for o in m(x)).backward()
    grads = dict(cp.named_parameters())
    for name, p in plain.named_parameters():
        assert max_rel_err(grads[name].grad, p.grad) < 1e-5, name


def test_stochastic_depth_schedule():
    m = SwinTransformer(drop_path_rate=0.3)
    rates = [b.drop_path.drop_prob for s in m.stages for b in s.blocks]
    want = torch.linspace(0, 0.3, 12).tolist()
    assert rates == pytest.approx(want)


@pytest.mark.slow(reason='Swin-T at many sizes, twice')
def test_no_state_is_kept_between_calls():
    """Masks, gather indices and the gathered bias are rebuilt per call: the modules hold
    nothing but parameters and the persistent relative_position_index buffers."""
    m = SwinTransformer(drop_path_rate=0.).eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    attrs_before = {id(mod): set(vars(mod)) for mod in m.modules()}
    with torch.no_grad():
        for size in ((64, 64), (96, 160), (33, 47)):
            m(torch.randn(1, 3, *size))
    after = m.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(set(vars(mod)) == attrs_before[id(mod)] for mod in m.modules())
    tensors = [t for mod in m.modules() for t in vars(mod).values()
               if isinstance(t, torch.Tensor)]
    assert tensors == []  # no tensor stashed as a plain attribute


# ------------------------------------------------------------------------- bad input
@pytest.mark.parametrize('x, exc, msg', [
    (torch.randn(3, 64, 64), ValueError, r'x must be 4-D \(B, C, H, W\)'),
    (torch.randn(1, 1, 3, 64, 64), ValueError, '4-D'),
    (torch.randn(1, 4, 64, 64), ValueError, 'in_channels=3'),
    (torch.randint(0, 255, (1, 3, 64, 64), dtype=torch.uint8), TypeError, 'floating-point'),
    ([[1.0]], TypeError, 'torch.Tensor'),
])
def test_bad_inputs_raise_at_the_boundary(x, exc, msg):
    with pytest.raises(exc, match=msg):
        SwinTransformer(**NARROW)(x)


@pytest.mark.parametrize('kwargs, exc, msg', [
    (dict(window_size=0), ValueError, 'window_size must be >= 1'),
    (dict(window_size=2.5), TypeError, 'window_size must be an int'),
    (dict(depths=(2, 2, 6, 2), num_heads=(3, 6, 12)), IndexError,
     r'num_heads must have an entry for each of the 4 stages'),
    (dict(embed_dims=100), ValueError, r'divisible by num_heads\[0\] \(3\)'),
    (dict(strides=(2, 2, 2, 2)), ValueError, r'strides\[0\] \(2\) must equal patch_size \(4\)'),
    (dict(out_indices=(0, 4)), ValueError, r'out_indices must be stage indices in \[0, 3\]'),
    (dict(out_indices=(-1, )), ValueError, 'out_indices'),
    (dict(arch='huge'), ValueError, 'arch must be one of'),
    (dict(frozen_stages=7), ValueError, 'frozen_stages'),
    (dict(norm_cfg=dict(type='BN')), ValueError, "norm_cfg type must be 'LN'"),
    (dict(pretrained=3), TypeError, 'pretrained must be a str'),
])
def test_bad_config_raises(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        SwinTransformer(**kwargs)


def test_ffn_recomputed_gelu_matches_autograd():
    from mmvitswin.core.layers import FFN
    torch.manual_seed(0)
    ffn = FFN(8, 32).double().train()
    x = torch.randn(4, 5, 8, dtype=torch.float64, requires_grad=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny ops: thread hand-offs would dominate
    try:
        assert torch.autograd.gradcheck(lambda t: ffn(t), (x, ))
    finally:
        torch.set_num_threads(threads)
    out = ffn(x)
    with torch.no_grad():
        plain = ffn.layers(x)
    assert torch.allclose(out, plain)
    # the memory-saving path is really taken: GELU's output is not among the saved tensors
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t,
                                                  lambda t: t):
        ffn(x)
    assert saved.count(torch.Size([4, 5, 32])) == 1

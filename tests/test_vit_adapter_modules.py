"""ViT-Adapter interaction modules: mmcv's deformable attention (CPU path) against a hand-written
bilinear reference, reference-point geometry, the injector's zero init, the output head's
composition, pyramid shapes for non-square padded inputs, gradients and input errors."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.ops import MultiScaleDeformableAttention

from mmvitswin.core.backbones.vit_adapter_modules import (
    Injector, InteractionAdapter, MultiLevelDWConv, deform_inputs, deformable_attention,
    maps_to_tokens, tokens_to_maps)
from mmvitswin.core.layers import Attention
from conftest import max_rel_err

DIMS, HEADS = 32, 2


# ----------------------------------------------------------------------------- references
def bilinear_zeros(v: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sample ``v: (B, h, w, D)`` at normalised ``x, y: (B, ...)`` like ``grid_sample`` with
    ``align_corners=False, padding_mode='zeros'``, written out: pixel i covers [i/n, (i+1)/n].
    Returns ``(B, ..., D)``."""
    b, h, w, d = v.shape
    px, py = x * w - 0.5, y * h - 0.5
    x0, y0 = px.floor(), py.floor()
    fx, fy = px - x0, py - y0
    flat = v.reshape(b, h * w, d)
    out = 0.
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            xi, yi = x0 + dx, y0 + dy
            inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
            idx = (yi.clamp(0, h - 1) * w + xi.clamp(0, w - 1)).long().reshape(b, -1, 1)
            picked = torch.gather(flat, 1, idx.expand(-1, -1, d)).reshape(*x.shape, d)
            out = out + picked * (wx * wy * inside)[..., None]
    return out


def reference_deform_attn(attn: MultiScaleDeformableAttention, query, value, ref_points,
                          shapes):
    """Multi-scale deformable attention from its definition: per head, a softmax over all
    levels x points of bilinear samples at reference + offset / (w, h)."""
    b, nq, _ = query.shape
    heads, levels, points = attn.num_heads, attn.num_levels, attn.num_points
    v = attn.value_proj(value)
    head_dim = v.shape[-1] // heads
    offsets = attn.sampling_offsets(query).view(b, nq, heads, levels, points, 2)
    weights = attn.attention_weights(query).view(b, nq, heads, levels * points).softmax(-1)
    weights = weights.view(b, nq, heads, levels, points)
    ref = ref_points.reshape(1, nq, 2).expand(b, -1, -1)
    out = torch.zeros(b, nq, heads, head_dim)
    start = 0
    for lvl, (h, w) in enumerate(shapes):
        v_l = v[:, start:start + h * w].reshape(b, h, w, heads, head_dim)
        start += h * w
        for hd in range(heads):
            x = ref[:, :, None, 0] + offsets[:, :, hd, lvl, :, 0] / w  # (B, Nq, P)
            y = ref[:, :, None, 1] + offsets[:, :, hd, lvl, :, 1] / h
            samples = bilinear_zeros(v_l[..., hd, :], x, y)  # (B, Nq, P, D)
            out[:, :, hd] += (samples * weights[:, :, hd, lvl, :, None]).sum(2)
    return attn.output_proj(out.reshape(b, nq, -1))


def make_msda(dims, heads, levels, points, ratio=1.0):
    attn = MultiScaleDeformableAttention(dims, heads, levels, points, dropout=0.,
                                         batch_first=True, value_proj_ratio=ratio)
    with torch.no_grad():  # offsets of a few pixels, some landing outside the maps
        attn.sampling_offsets.weight.normal_(0, 0.5)
        attn.sampling_offsets.bias.normal_(0, 2.)
        attn.attention_weights.weight.normal_(0, 0.2)
    return attn


class StandInTrunk(nn.Module):
    """The trunk protocol the adapter drives, around two pre-norm attention blocks: the
    "embedding" returns the tokens a test sets (``trunk.tokens``, CLS-free unless
    ``num_prefix_tokens``), ``forward_blocks`` records its calls."""

    def __init__(self, dims=DIMS, depth=2, num_prefix_tokens=0):
        super().__init__()
        self.num_prefix_tokens = num_prefix_tokens
        self.norms = nn.ModuleList([nn.LayerNorm(dims) for _ in range(depth)])
        self.blocks = nn.ModuleList([Attention(dims, 4) for _ in range(depth)])
        self.calls, self.inputs = [], []
        self.tokens = None

    def prepare_tokens(self, img):
        return self.tokens, (img.shape[-2] // 16, img.shape[-1] // 16)

    def forward_blocks(self, x, hw, start, end):
        self.calls.append((start, end, tuple(hw)))
        self.inputs.append(x)
        for i in range(start, end):
            x = x + self.blocks[i](self.norms[i](x))
        return x


def run(adapter, img, tokens, trunk):
    trunk.tokens = tokens
    return adapter(img, trunk)


def make_adapter(**kwargs):
    cfg = dict(embed_dims=DIMS, num_heads=HEADS, interaction_indexes=[(0, 1), (1, 2)],
               conv_inplane=8)
    cfg.update(kwargs)
    return InteractionAdapter(**cfg)


def inputs_for(h, w, b=2):
    img = torch.randn(b, 3, h, w)
    tokens = torch.randn(b, (h // 16) * (w // 16), DIMS, requires_grad=True)
    return img, tokens, (h // 16, w // 16)


# ------------------------------------------------------------ deformable attention (CPU path)
def test_mmcv_deformable_attention_cpu_matches_bilinear_reference():
    shapes = [(6, 10), (3, 5), (2, 3)]  # non-square, odd: like c2/c3/c4 of a 48x80 image
    attn = make_msda(DIMS, 4, len(shapes), 3, ratio=0.5)
    inputs = deform_inputs([(4, 5)], shapes)
    query = torch.randn(2, 20, DIMS)
    value = torch.randn(2, sum(h * w for h, w in shapes), DIMS)
    with torch.no_grad():
        ours = deformable_attention(attn, query, value, inputs)
        ref = reference_deform_attn(attn, query, value, inputs.reference_points, shapes)
        with_identity = deformable_attention(attn, query, value, inputs, identity=query)
    assert ours.shape == (2, 20, DIMS)
    assert max_rel_err(ours, ref) < 1e-5
    # mmcv adds ``identity``; our wrapper passes it through unchanged when given.
    assert max_rel_err(with_identity, ref + query) < 1e-5


def test_deform_inputs_layout():
    inputs = deform_inputs([(3, 5)], [(6, 10), (3, 5), (2, 3)])
    assert inputs.spatial_shapes.tolist() == [[6, 10], [3, 5], [2, 3]]
    assert inputs.spatial_shapes.dtype == torch.long
    assert inputs.level_start_index.tolist() == [0, 60, 75]
    assert inputs.reference_points.shape == (1, 15, 1, 2)
    # row-major pixel centres, (x, y) order
    assert torch.allclose(inputs.reference_points[0, 6, 0], torch.tensor([1.5 / 5, 1.5 / 3]))


def _identity_sampler(levels=1):
    """A 1-head, 1-point attention that reads exactly at the reference point(s)."""
    attn = MultiScaleDeformableAttention(4, 1, levels, 1, dropout=0., batch_first=True)
    with torch.no_grad():
        for lin in (attn.sampling_offsets, attn.attention_weights):
            lin.weight.zero_()
            lin.bias.zero_()
        for lin in (attn.value_proj, attn.output_proj):
            lin.weight.copy_(torch.eye(4))
            lin.bias.zero_()
    return attn


@pytest.mark.parametrize('hw', [(5, 7), (3, 10)])
def test_reference_points_hit_pixel_centres(hw):
    h, w = hw
    attn = _identity_sampler()
    value = torch.randn(1, h * w, 4)
    query = torch.randn(1, h * w, 4)
    # same grid (extractor reading c3-sized tokens): every query reads its own pixel
    out = deformable_attention(attn, query, value, deform_inputs([hw], [hw]))
    assert torch.allclose(out, value, atol=1e-6)
    # coarse queries reading a 2x finer level (ViT token reading c2) land between 2x2 pixels
    fine = torch.randn(1, 4 * h * w, 4)
    out = deformable_attention(attn, query, fine, deform_inputs([hw], [(2 * h, 2 * w)]))
    pooled = F.avg_pool2d(fine.transpose(1, 2).reshape(1, 4, 2 * h, 2 * w), 2)
    assert torch.allclose(out, pooled.flatten(2).transpose(1, 2), atol=1e-6)


def test_injector_adds_gamma_scaled_attention_only():
    c_shapes = [(4, 6), (2, 3), (1, 2)]  # Nc = 32
    inj = Injector(DIMS, HEADS, n_points=2)
    with torch.no_grad():
        inj.attn.sampling_offsets.bias.normal_(0, 2.)
        inj.gamma.normal_()
    x, c = torch.randn(2, 6, DIMS), torch.randn(2, 32, DIMS)
    inputs = deform_inputs([(2, 3)], c_shapes)
    with torch.no_grad():
        expected = x + inj.gamma * reference_deform_attn(
            inj.attn, inj.query_norm(x), inj.feat_norm(c), inputs.reference_points, c_shapes)
        assert max_rel_err(inj(x, c, inputs), expected) < 1e-5


def test_multilevel_dwconv_convolves_each_level_separately():
    shapes = [(4, 6), (2, 3), (1, 2)]
    maps = [torch.randn(2, 8, h, w) for h, w in shapes]
    dw = MultiLevelDWConv(8)
    nn.init.normal_(dw.dwconv.weight)
    out = tokens_to_maps(dw(maps_to_tokens(maps), shapes), shapes)
    for o, m in zip(out, maps):
        assert torch.allclose(o, dw.dwconv(m), atol=1e-6)


# ------------------------------------------------------------------------------- the adapter
@pytest.mark.parametrize('size,out_channels', [((64, 96), None), ((96, 160), 24),
                                               ((160, 224), None)])
def test_pyramid_shapes_and_block_schedule(size, out_channels):
    h, w = size
    trunk = StandInTrunk()
    adapter = make_adapter(out_channels=out_channels)
    img, tokens, hw = inputs_for(h, w, b=2 if h < 160 else 1)
    outs = run(adapter, img, tokens, trunk)
    c = out_channels or DIMS
    assert [tuple(o.shape) for o in outs] == [
        (img.shape[0], c, h // s, w // s) for s in (4, 8, 16, 32)]
    assert all(torch.isfinite(o).all() for o in outs)
    assert trunk.calls == [(0, 1, hw), (1, 2, hw)]


def test_backward_reaches_spm_and_tokens():
    trunk = StandInTrunk()
    adapter = make_adapter()
    img, tokens, hw = inputs_for(64, 96)
    outs = run(adapter, img, tokens, trunk)
    # a random projection: sum(o ** 2) would be constant under train-mode BatchNorm
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    for name, p in adapter.spm.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    for p in (adapter.level_embed, adapter.up.weight, tokens,
              adapter.interactions[0].injector.gamma,
              adapter.interactions[1].extra_extractors[1].attn.value_proj.weight,
              trunk.blocks[0].qkv.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    # with gamma = 0 the injectors' attention receives no gradient yet, only gamma does
    assert adapter.interactions[0].injector.attn.value_proj.weight.grad.abs().max() == 0


def test_injector_zero_init_leaves_tokens_unchanged():
    trunk = StandInTrunk()
    adapter = make_adapter()
    img, tokens, hw = inputs_for(64, 96)
    run(adapter, img, tokens, trunk)
    assert torch.equal(trunk.inputs[0], tokens)
    with torch.no_grad():
        adapter.interactions[0].injector.gamma.fill_(1.)
    trunk.inputs.clear()
    run(adapter, img, tokens, trunk)
    assert not torch.allclose(trunk.inputs[0], tokens, atol=1e-3)


def test_output_head_composition():
    """f1 = c1 + up(c2) + resize(x); f2..f4 = c_i + resize(x); BatchNorm per level (the paper)."""
    trunk = StandInTrunk()
    adapter = make_adapter(use_extra_extractor=False).eval()
    for i in range(1, 5):  # non-trivial running stats, so each norm's identity matters
        norm = getattr(adapter, f'norm{i}')
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2.)
    img, tokens, hw = inputs_for(96, 160, b=1)
    seen = {}
    adapter.spm.register_forward_hook(lambda m, a, out: seen.update(c1=out[0]))
    adapter.interactions[-1].register_forward_hook(lambda m, a, out: seen.update(x=out[0],
                                                                                 c=out[1]))
    with torch.no_grad():
        outs = run(adapter, img, tokens, trunk)
        shapes = [(12, 20), (6, 10), (3, 5)]
        c2, c3, c4 = tokens_to_maps(seen['c'], shapes)
        vit = seen['x'].transpose(1, 2).reshape(1, DIMS, *hw)
        up = lambda s: F.interpolate(vit, size=s, mode='bilinear', align_corners=False)  # noqa
        summed = [seen['c1'] + adapter.up(c2) + up((24, 40)), c2 + up((12, 20)), c3 + vit,
                  c4 + up((3, 5))]
        expected = [getattr(adapter, f'norm{i + 1}')(f) for i, f in enumerate(summed)]
    for o, e in zip(outs, expected):
        assert max_rel_err(o, e) < 1e-5


def test_with_cp_gives_same_values_and_grads():
    trunk = StandInTrunk()
    plain, ckpt = make_adapter(), make_adapter(with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    img, _, hw = inputs_for(64, 96)
    img.requires_grad_(True)  # the SPM checkpoints only when its input needs grad
    results = []
    for model in (plain, ckpt):
        tokens = torch.randn(2, 24, DIMS, generator=torch.Generator().manual_seed(1),
                             requires_grad=True)
        outs = run(model, img, tokens, trunk)
        sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
        results.append((outs, model.spm.stem[0].weight.grad.clone(), tokens.grad))
    for a, b in zip(results[0][0], results[1][0]):
        assert max_rel_err(b.detach(), a.detach()) < 1e-5
    assert max_rel_err(results[1][1], results[0][1]) < 1e-4
    assert max_rel_err(results[1][2], results[0][2]) < 1e-4


def test_structure_and_checkpoint_key_layout():
    adapter = make_adapter(interaction_indexes=[(0, 1), (1, 3), (3, 4)],
                           norm_cfg=dict(type='SyncBN'))
    assert [b.extra_extractors is not None for b in adapter.interactions] == [False, False, True]
    assert len(adapter.interactions[2].extra_extractors) == 2
    assert isinstance(adapter.norm1, nn.SyncBatchNorm)
    assert isinstance(adapter.spm.stem[1], nn.SyncBatchNorm)
    keys = set(adapter.state_dict())
    # the original ViT-Adapter names, so released weights load by a prefix rename
    for key in ('level_embed', 'spm.stem.0.weight', 'spm.stem.7.running_mean',
                'spm.conv4.1.weight', 'spm.fc4.bias', 'interactions.0.injector.gamma',
                'interactions.0.injector.attn.sampling_offsets.weight',
                'interactions.1.extractor.ffn.dwconv.dwconv.weight',
                'interactions.2.extra_extractors.1.ffn_norm.weight', 'up.weight', 'norm4.weight'):
        assert key in keys, key
    assert make_adapter(use_extra_extractor=False).interactions[-1].extra_extractors is None


# ------------------------------------------------------------------------------------ errors
def test_forward_errors_name_the_argument():
    trunk = StandInTrunk()
    adapter = make_adapter()
    img, tokens, hw = inputs_for(64, 96)
    with pytest.raises(ValueError, match='img'):  # W = 80 is not a multiple of 32
        run(adapter, torch.randn(2, 3, 64, 80), tokens[:, :20], trunk)
    with pytest.raises(TypeError, match='img'):
        run(adapter, img.long(), tokens, trunk)
    with pytest.raises(ValueError, match='img'):
        run(adapter, img[:, :1], tokens, trunk)
    with pytest.raises(TypeError, match='trunk'):
        adapter(img, None)
    with pytest.raises(ValueError, match='tokens'):  # a CLS token the trunk does not declare
        run(adapter, img, torch.cat([tokens[:, :1], tokens], 1), trunk)
    with pytest.raises(ValueError, match='tokens'):
        run(adapter, img, tokens[..., :16], trunk)


def test_prefix_tokens_go_through_the_blocks_but_not_the_adapter():
    """A CLS token declared by the trunk reaches every group of blocks (updated by the
    previous one) and never the injector/extractor: the result equals the CLS-free run when
    the blocks treat tokens independently."""
    img, tokens, _ = inputs_for(64, 96)
    cls = torch.randn(2, 1, DIMS)
    plain, with_cls = StandInTrunk(), StandInTrunk(num_prefix_tokens=1)
    for trunk in (plain, with_cls):  # per-token blocks: CLS cannot change the patch tokens
        trunk.blocks = nn.ModuleList([nn.Linear(DIMS, DIMS) for _ in range(2)])
    with_cls.load_state_dict(plain.state_dict())
    adapter = make_adapter().eval()
    with torch.no_grad():
        want = run(adapter, img, tokens, plain)
        got = run(adapter, img, torch.cat([cls, tokens], 1), with_cls)
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want))
    first, second = with_cls.inputs
    assert torch.equal(first[:, :1], cls)
    expected_cls = cls + with_cls.blocks[0](with_cls.norms[0](cls))
    assert torch.allclose(second[:, :1], expected_cls, atol=1e-6)


@pytest.mark.parametrize('kwargs,name', [
    (dict(interaction_indexes=[(0, 2), (3, 5)]), 'interaction_indexes'),  # inclusive style
    (dict(interaction_indexes=[(1, 3)]), 'interaction_indexes'),
    (dict(interaction_indexes=[]), 'interaction_indexes'),
    (dict(num_heads=3), 'num_heads'),
    (dict(deform_ratio=0.1), 'num_heads'),
    (dict(norm_cfg=dict(type='GN')), 'norm_cfg'),
    (dict(out_channels=0), 'out_channels'),
])
def test_constructor_errors(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_adapter(**kwargs)

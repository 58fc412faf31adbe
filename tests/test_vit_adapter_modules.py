"""ViT-Adapter interaction modules: our deformable attention against a hand-written bilinear
reference and against mmcv's ``MultiScaleDeformableAttention`` (oracle: same parameters, same
init), reference-point geometry (also for a stride-14 token grid), the injector's zero init, the
output head's composition, pyramid shapes for non-square padded inputs, gradients and input
errors."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmvitswin.core.backbones.vit_adapter_modules import (
    Injector, InteractionAdapter, MultiLevelDWConv, MultiScaleDeformableAttention, deform_inputs,
    deformable_attention, maps_to_tokens, sample_levels, tokens_to_maps)
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
    attn = MultiScaleDeformableAttention(dims, heads, levels, points, value_proj_ratio=ratio)
    with torch.no_grad():  # offsets of a few pixels, some landing outside the maps
        attn.sampling_offsets.weight.normal_(0, 0.5)
        attn.sampling_offsets.bias.normal_(0, 2.)
        attn.attention_weights.weight.normal_(0, 0.2)
    return attn


class StandInBlock(nn.Module):
    """A pre-norm attention block with the trunk blocks' call signature ``(seq, grid, P,
    plan)`` (no windows: the adapter passes no plan); records its calls into ``log``."""

    def __init__(self, index, log, dims=DIMS):
        super().__init__()
        self.index, self.log = index, log
        self.norm = nn.LayerNorm(dims)
        self.attn = Attention(dims, 4)

    def forward(self, seq, grid, num_prefix, plan):
        assert plan is None
        self.log.append((self.index, tuple(grid), num_prefix, seq))
        return seq + self.attn(self.norm(seq))


class StandInTrunk(nn.Module):
    """What the builder hands the adapter: its blocks (``blocks``) and an embedding whose
    tokens a test sets (``trunk.tokens``, CLS-free unless ``num_prefix_tokens``)."""

    def __init__(self, dims=DIMS, depth=2, num_prefix_tokens=0):
        super().__init__()
        self.num_prefix_tokens = num_prefix_tokens
        self.log = []
        self.blocks = nn.ModuleList([StandInBlock(i, self.log, dims) for i in range(depth)])

    @property
    def calls(self):
        return [(i, grid, p) for i, grid, p, _ in self.log]

    @property
    def inputs(self):
        return [seq for i, _, _, seq in self.log]


def run(adapter, img, tokens, trunk, stride=16):
    grid = (-(-img.shape[-2] // stride), -(-img.shape[-1] // stride))
    return adapter(img, tokens, grid, trunk.blocks, trunk.num_prefix_tokens)


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
def test_deformable_attention_matches_bilinear_reference():
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


def grid_sample_levels(value, shapes, locations, weights):
    """The sampling core as ``grid_sample`` per level (mmcv's PyTorch fallback does the same):
    the oracle of :func:`sample_levels`, values and gradients."""
    b, _, heads, d = value.shape
    out, start = 0, 0
    for level, (h, w) in enumerate(shapes):
        v = value[:, start:start + h * w].permute(0, 2, 3, 1).reshape(b * heads, d, h, w)
        start += h * w
        grid = (2 * locations[:, :, :, level] - 1).transpose(1, 2).flatten(0, 1)
        read = F.grid_sample(v, grid, mode='bilinear', padding_mode='zeros', align_corners=False)
        out = out + (read * weights[:, :, :, level].transpose(1, 2).flatten(0, 1)[:, None]).sum(-1)
    return out.view(b, heads * d, -1).transpose(1, 2)


@pytest.mark.parametrize('on_pixels', [False, True])
def test_sampling_core_equals_grid_sample_with_gradients(on_pixels):
    """Points inside, across the border and outside every level; ``on_pixels``: exactly on
    pixel centres and edges (binary fractions, so both sides see the same exact floor), where
    the bilinear weights of a corner are 0 or 1."""
    torch.manual_seed(0)
    shapes = [(4, 8), (2, 4), (1, 2)]
    b, nq, heads, d, points = 2, 10, 3, 5, 4
    value = torch.randn(b, 42, heads, d, dtype=torch.float64, requires_grad=True)
    size = (b, nq, heads, len(shapes), points, 2)
    if on_pixels:
        locations = (torch.randint(-3, 20, size).double() / 16).requires_grad_()
    else:
        locations = (torch.rand(size, dtype=torch.float64) * 1.6 - 0.3).requires_grad_()
    weights = torch.rand(size[:-1], dtype=torch.float64, requires_grad=True)
    layout = deform_inputs([(1, 1)], shapes)
    assert layout.level_sizes.tolist() == [[8, 4], [4, 2], [2, 1]]  # (w, h)
    assert layout.level_starts.tolist() == [0, 32, 40]
    assert layout.level_strides.tolist() == [[1, 8], [1, 4], [1, 2]]  # rows per x, y step
    ours = sample_levels(value, locations, weights,
                         layout._replace(level_sizes=layout.level_sizes.double()))
    ref = grid_sample_levels(value, shapes, locations, weights)
    assert ours.shape == (b, nq, heads * d)
    assert torch.allclose(ours, ref, atol=1e-12)
    grad = torch.randn_like(ours)
    for a, r in zip(torch.autograd.grad(ours, (value, locations, weights), grad),
                    torch.autograd.grad(ref, (value, locations, weights), grad)):
        assert torch.allclose(a, r, atol=1e-10)


def test_deform_inputs_layout():
    inputs = deform_inputs([(3, 5)], [(6, 10), (3, 5), (2, 3)])
    assert inputs.value_shapes == ((6, 10), (3, 5), (2, 3))
    assert inputs.reference_points.shape == (1, 15, 1, 2)
    # row-major pixel centres, (x, y) order
    assert torch.allclose(inputs.reference_points[0, 6, 0], torch.tensor([1.5 / 5, 1.5 / 3]))


def test_deform_inputs_place_levels_by_their_extent():
    """A stride-14 grid of a 64 x 96 image has 5 x 7 cells covering 70 x 98 pixels: its cell
    (i, j) centre is pixel ((j + .5) 14, (i + .5) 14), i.e. that over the image's extent in
    the stride-16/32 value levels, and a c-level query reads the ViT level at its own pixel."""
    img, vit = (64, 96), (70, 98)
    inject = deform_inputs([(5, 7)], [(8, 12), (4, 6), (2, 3)], None, vit, [img] * 3)
    assert inject.reference_points.shape == (1, 35, 3, 2)
    i, j = 2, 3
    want = torch.tensor([(j + .5) * 14 / 96, (i + .5) * 14 / 64])
    for level in range(3):
        assert torch.allclose(inject.reference_points[0, i * 7 + j, level], want)
    extract = deform_inputs([(8, 12)], [(5, 7)], None, img, [vit])
    want = torch.tensor([(j + .5) * 8 / 98, (i + .5) * 8 / 70])
    assert torch.allclose(extract.reference_points[0, i * 12 + j, 0], want)
    # an identity sampler at these points reads the bilinear value at that pixel
    attn = _identity_sampler()
    value = torch.randn(1, 35, 4)
    out = deformable_attention(attn, torch.randn(1, 96, 4), value, extract)
    grid = value.transpose(1, 2).reshape(1, 4, 5, 7)
    px = torch.tensor([(jj + .5) * 8 / 14 - .5 for jj in range(12)])
    py = torch.tensor([(ii + .5) * 8 / 14 - .5 for ii in range(8)])
    norm = torch.stack(torch.meshgrid(2 * (py + .5) / 5 - 1, 2 * (px + .5) / 7 - 1,
                                      indexing='ij')[::-1], -1)[None]
    ref = F.grid_sample(grid, norm, align_corners=False).flatten(2).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-5)


def test_our_deformable_attention_matches_mmcv():
    """mmcv's module is the oracle: same parameter names and shapes, same init (seeded), and
    its forward (CPU: its PyTorch sampling core) equals ours on copied weights."""
    mmcv_ops = pytest.importorskip('mmcv.ops')
    torch.manual_seed(3)
    theirs = mmcv_ops.MultiScaleDeformableAttention(DIMS, 4, 3, 2, dropout=0., batch_first=True,
                                                    value_proj_ratio=0.5)
    torch.manual_seed(3)
    ours = MultiScaleDeformableAttention(DIMS, 4, 3, 2, value_proj_ratio=0.5)
    theirs_sd, ours_sd = theirs.state_dict(), ours.state_dict()
    assert sorted(theirs_sd) == sorted(ours_sd)
    for key in ('sampling_offsets.weight', 'sampling_offsets.bias', 'attention_weights.weight',
                'attention_weights.bias', 'value_proj.bias', 'output_proj.bias'):
        assert torch.equal(theirs_sd[key], ours_sd[key]), key  # deterministic parts of init
    for key in ('value_proj.weight', 'output_proj.weight'):  # Xavier-uniform: same bound
        bound = (6 / sum(ours_sd[key].shape))**0.5
        assert ours_sd[key].abs().max() <= bound and ours_sd[key].abs().max() > 0.8 * bound
    with torch.no_grad():  # offsets of a few pixels, some landing outside the maps
        theirs.sampling_offsets.bias.normal_(0, 2.)
        theirs.sampling_offsets.weight.normal_(0, 0.5)
        theirs.attention_weights.weight.normal_(0, 0.2)
    ours.load_state_dict(theirs.state_dict())
    shapes = [(6, 10), (3, 5), (2, 3)]
    inputs = deform_inputs([(4, 5)], shapes)
    query = torch.randn(2, 20, DIMS)
    value = torch.randn(2, sum(h * w for h, w in shapes), DIMS)
    spatial = torch.tensor(shapes)
    start = torch.tensor([0, 60, 75])
    with torch.no_grad():
        want = theirs(query, value=value, identity=query,
                      reference_points=inputs.reference_points.expand(2, -1, 3, -1),
                      spatial_shapes=spatial, level_start_index=start)
        got = ours(query, value, inputs, identity=query)
    assert max_rel_err(got, want) < 1e-5


def _identity_sampler(levels=1):
    """A 1-head, 1-point attention that reads exactly at the reference point(s)."""
    attn = MultiScaleDeformableAttention(4, 1, levels, 1)
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
    assert trunk.calls == [(0, hw, 0), (1, hw, 0)]


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
              trunk.blocks[0].attn.qkv.weight):
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
    trunk.log.clear()
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


@pytest.mark.slow(reason='forward-backward with and without activation checkpointing')
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
    with pytest.raises(TypeError, match='blocks'):
        adapter(img, tokens, hw, None)
    with pytest.raises(ValueError, match='blocks'):
        adapter(img, tokens, hw, trunk.blocks[:1])
    with pytest.raises(ValueError, match='grid'):
        adapter(img, tokens, (hw[0] + 1, hw[1]), trunk.blocks)
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
        for block in trunk.blocks:
            block.attn = nn.Linear(DIMS, DIMS)
    with_cls.load_state_dict(plain.state_dict())
    adapter = make_adapter().eval()
    with torch.no_grad():
        want = run(adapter, img, tokens, plain)
        got = run(adapter, img, torch.cat([cls, tokens], 1), with_cls)
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want))
    first, second = with_cls.inputs
    assert torch.equal(first[:, :1], cls)
    expected_cls = cls + with_cls.blocks[0].attn(with_cls.blocks[0].norm(cls))
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

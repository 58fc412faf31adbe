"""DINOv3 ViTs on our trunk (2-D RoPE, registers, LayerScale, no absolute position embedding,
MLP or SwiGLU), against HuggingFace ``transformers``' ``DINOv3ViTModel`` as the oracle.

Random-weight oracles (small widths, built from a config: nothing is downloaded) are saved in
every layout users download: an HF snapshot directory (``config.json`` + ``model.safetensors``,
keys ``layer.N`` as the hub ships them), the module's own names with a wrapping prefix
(``model.layer.N`` under ``dinov3.``), Meta's ``dinov3_vit*.pth`` (``storage_tokens``,
``rope_embed.periods``, a fused ``qkv`` with its ``bias_mask``) and timm's ``vit_*_dinov3``
(``.safetensors``: ``reg_token``, ``q_bias``/``v_bias``, ``gamma_1``, ``fc1_g``/``fc1_x``).
Our ``ViTAdapter(arch='dinov3-b', ...)`` loads each through ``init_cfg`` and reproduces the
oracle's patch tokens (after its final norm) at several sizes: the RoPE is defined for any
grid, so every size is compared directly (sizes are multiples of the patch: HF drops a partial
last patch, we pad it; padding is tested on its own).

The ViT-7B (``arch='dinov3-7b'``) is checked at full size on the meta device (shapes against
HF's 7B config, parameter count) and as a narrow stand-in of the same structure (SwiGLU at
twice the width, no q/k/v bias) saved as the hub ships it: a two-shard HF snapshot with its
``model.safetensors.index.json``, Meta's layout with bf16-rounded RoPE periods and the
training-only ``local_cls_norm``, and timm's.
"""
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from conftest import max_rel_err
from mmvitswin.core.backbones.vit import ViTAdapter
from mmvitswin.core.checkpoint import CheckpointError
from mmvitswin.core.layers import (RotaryPositionEmbedding2d, apply_rope, patch_center_coords,
                                   rope_cos_sin, rope_periods, rotate_half)

transformers = pytest.importorskip('transformers')
safetensors_torch = pytest.importorskip('safetensors.torch')

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_register_tokens=4, patch_size=16, image_size=64, layerscale_value=0.5)
SIZES = [(64, 64), (48, 80), (160, 112), (256, 32)]  # square, non-square, far, thin


def ours_kwargs(gated: bool = False, **overrides) -> dict:
    cfg = dict(arch='dinov3-b', embed_dims=64, num_layers=4, num_heads=4,
               mlp_ratio=2.0, ffn_type='swiglu' if gated else 'mlp')
    cfg.update(overrides)
    return cfg


def randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial weights everywhere (HF zero-initialises biases, ones the LayerScales)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            if 'norm' in name and name.endswith('weight'):
                p.add_(1.0)
            if 'lambda1' in name:
                p.add_(0.5)
    return model.eval()


def hf_model(gated: bool = False, **overrides):
    # the released gated models (S+, H+) use SiLU: SwiGLU
    act = 'silu' if gated else 'gelu'
    cfg = transformers.DINOv3ViTConfig(**dict(SMALL, use_gated_mlp=gated, hidden_act=act,
                                              **overrides))
    return randomise(transformers.DINOv3ViTModel(cfg))


def hf_patch_tokens(model, x: torch.Tensor) -> torch.Tensor:
    """The oracle's patch tokens after its final norm, as a (B, C, h, w) map."""
    with torch.no_grad():
        seq = model(x).last_hidden_state
    prefix = 1 + model.config.num_register_tokens
    h, w = x.shape[-2] // 16, x.shape[-1] // 16
    return seq[:, prefix:].transpose(1, 2).reshape(x.shape[0], -1, h, w)


# ----------------------------------------------------------------- layouts of the oracle
def hf_state(model) -> dict:
    """What ``save_pretrained`` writes: ``layer.N`` (HF's on-disk names)."""
    return {k.replace('model.layer.', 'layer.'): v.contiguous()
            for k, v in model.state_dict().items()}


def to_meta(model, periods_dtype: torch.dtype = torch.float32,
            local_cls_norm: bool = False) -> dict:
    """Meta's layout. ``periods_dtype=torch.bfloat16``: the RoPE periods rounded to bf16, as
    Meta's released files hold them; ``local_cls_norm``: the 7B's training-only norm of the
    local crops' CLS/register tokens (``untie_global_and_local_cls_norm``). A model without
    q/v biases (the 7B) has no ``qkv.bias`` and no ``bias_mask``, as Meta's ``qkv_bias=False``."""
    sd = hf_state(model)
    dim = model.config.hidden_size
    periods = rope_periods(dim // model.config.num_attention_heads, model.config.rope_theta)
    out = {'cls_token': sd['embeddings.cls_token'],
           'storage_tokens': sd['embeddings.register_tokens'],
           'mask_token': sd['embeddings.mask_token'].reshape(1, dim),
           'patch_embed.proj.weight': sd['embeddings.patch_embeddings.weight'],
           'patch_embed.proj.bias': sd['embeddings.patch_embeddings.bias'],
           'rope_embed.periods': periods.to(periods_dtype),
           'norm.weight': sd['norm.weight'], 'norm.bias': sd['norm.bias']}
    if local_cls_norm:  # random: it must not reach the features
        out['local_cls_norm.weight'] = torch.randn(dim)
        out['local_cls_norm.bias'] = torch.randn(dim)
    for i in range(model.config.num_hidden_layers):
        p = f'layer.{i}.'
        b = f'blocks.{i}.'
        att = p + 'attention.'
        out[b + 'attn.qkv.weight'] = torch.cat([sd[att + f'{n}_proj.weight'] for n in 'qkv'])
        if att + 'q_proj.bias' in sd:
            # Meta stores a key bias (random here) and masks it out at run time
            out[b + 'attn.qkv.bias'] = torch.cat([sd[att + 'q_proj.bias'], torch.randn(dim),
                                                  sd[att + 'v_proj.bias']])
            out[b + 'attn.qkv.bias_mask'] = torch.cat([torch.ones(dim), torch.zeros(dim),
                                                       torch.ones(dim)])
        for name in ('weight', 'bias'):
            out[b + f'attn.proj.{name}'] = sd[att + f'o_proj.{name}']
            out[b + f'norm1.{name}'] = sd[p + f'norm1.{name}']
            out[b + f'norm2.{name}'] = sd[p + f'norm2.{name}']
            if model.config.use_gated_mlp:
                for src, dst in (('gate_proj', 'w1'), ('up_proj', 'w2'), ('down_proj', 'w3')):
                    out[b + f'mlp.{dst}.{name}'] = sd[p + f'mlp.{src}.{name}']
            else:
                out[b + f'mlp.fc1.{name}'] = sd[p + f'mlp.up_proj.{name}']
                out[b + f'mlp.fc2.{name}'] = sd[p + f'mlp.down_proj.{name}']
        out[b + 'ls1.gamma'] = sd[p + 'layer_scale1.lambda1']
        out[b + 'ls2.gamma'] = sd[p + 'layer_scale2.lambda1']
    return out


def to_timm(model) -> dict:
    meta = to_meta(model)
    out = {}
    for k, v in meta.items():
        if k.endswith(('bias_mask', 'periods')) or k.startswith('local_cls_norm.') or \
                k == 'mask_token':
            continue  # timm's filter discards them
        if k.endswith('attn.qkv.bias'):
            q, _, vb = v.chunk(3)
            out[k.replace('qkv.bias', 'q_bias')] = q
            out[k.replace('qkv.bias', 'v_bias')] = vb
            continue
        k = k.replace('storage_tokens', 'reg_token').replace('ls1.gamma', 'gamma_1')
        k = k.replace('ls2.gamma', 'gamma_2').replace('mlp.w1', 'mlp.fc1_g')
        k = k.replace('mlp.w2', 'mlp.fc1_x').replace('mlp.w3', 'mlp.fc2')
        out[k] = v.contiguous()
    return out


def save_layouts(model, root) -> dict:
    snap = root / 'hf'
    snap.mkdir()
    model.config.save_pretrained(str(snap))
    safetensors_torch.save_file(hf_state(model), str(snap / 'model.safetensors'))
    wrapped = root / 'wrapped.pth'  # module names under a wrapping model's prefix
    torch.save({'state_dict': {'dinov3.' + k: v for k, v in model.state_dict().items()}},
               str(wrapped))
    meta = root / 'dinov3_vit_tiny_pretrain.pth'
    torch.save(to_meta(model), str(meta))
    timm = root / 'vit_tiny_patch16_dinov3.safetensors'
    safetensors_torch.save_file(to_timm(model), str(timm))
    return dict(hf=str(snap), wrapped=str(wrapped), meta=str(meta), timm=str(timm))


@pytest.fixture(scope='module', params=[False, True], ids=['mlp', 'swiglu'])
def case(request, tmp_path_factory):
    model = hf_model(gated=request.param)
    return request.param, model, save_layouts(model, tmp_path_factory.mktemp('dinov3'))


def load(path: str, gated: bool = False, **overrides) -> ViTAdapter:
    model = ViTAdapter(**ours_kwargs(gated, init_cfg=dict(type='Pretrained', checkpoint=path),
                                     **overrides))
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # nothing left over, nothing missing
        model.init_weights()
    return model.eval()


# ---------------------------------------------------------------------- the RoPE alone
@pytest.mark.parametrize('head_dim, theta', [(16, 100.0), (48, 100.0), (64, 10000.0)])
@pytest.mark.parametrize('grid', [(14, 14), (3, 5), (37, 2), (1, 1)])
def test_rope_equals_hf_rope_module(head_dim, theta, grid):
    from transformers.models.dinov3_vit.modeling_dinov3_vit import (
        DINOv3ViTRopePositionEmbedding, apply_rotary_pos_emb)
    cfg = transformers.DINOv3ViTConfig(hidden_size=head_dim * 2, num_attention_heads=2,
                                       rope_theta=theta, patch_size=16)
    hf = DINOv3ViTRopePositionEmbedding(cfg).eval()
    ours = RotaryPositionEmbedding2d(head_dim, theta)
    cos_ref, sin_ref = hf(torch.zeros(1, 3, 16 * grid[0], 16 * grid[1]))
    cos, sin = ours(grid)
    assert cos.shape == (grid[0] * grid[1], head_dim)
    assert torch.equal(cos, cos_ref) and torch.equal(sin, sin_ref)
    q = torch.randn(2, 2, 5 + grid[0] * grid[1], head_dim)  # 5 prefix tokens
    k = torch.randn_like(q)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos_ref, sin_ref)
    assert torch.allclose(apply_rope(q, cos, sin, 5), q_ref, atol=1e-6)
    assert torch.allclose(apply_rope(k, cos, sin, 5), k_ref, atol=1e-6)
    assert torch.equal(apply_rope(q, cos, sin, 5)[..., :5, :], q[..., :5, :])


def test_rope_training_mode_is_the_evaluation_rule():
    """HF jitters/rescales coordinates in training mode only; ours is always the eval rule."""
    ours = RotaryPositionEmbedding2d(16).train()
    cos_a, _ = ours((4, 6))
    cos_b, _ = ours((4, 6))
    assert torch.equal(cos_a, cos_b)


def test_rope_pieces():
    coords = patch_center_coords((2, 4))
    assert torch.allclose(coords[:, 0], torch.tensor([-.5] * 4 + [.5] * 4))
    assert torch.allclose(coords[:4, 1], torch.tensor([-.75, -.25, .25, .75]))
    x = torch.arange(4.)
    assert torch.equal(rotate_half(x), torch.tensor([-2., -3., 0., 1.]))
    cos, sin = rope_cos_sin((3, 3), rope_periods(8))
    assert torch.allclose(cos.square() + sin.square(), torch.ones(9, 8))
    with pytest.raises(ValueError, match='head_dim'):
        rope_periods(10)
    with pytest.raises(ValueError, match='theta'):
        rope_periods(8, theta=0)


# ------------------------------------------------------------------------------ parity
@pytest.mark.parametrize('fmt', ['hf', 'wrapped', 'meta', 'timm'])
def test_each_layout_reproduces_hf_at_several_sizes(case, fmt):
    gated, oracle, files = case
    model = load(files[fmt], gated)
    for size in SIZES:
        x = torch.randn(2, 3, *size)
        want = hf_patch_tokens(oracle, x)
        with torch.no_grad():
            (got, ) = model(x)
        assert got.shape == want.shape == (2, 64, size[0] // 16, size[1] // 16)
        assert max_rel_err(got, want) < 1e-5, (fmt, size)


def test_partial_patches_are_padded(case):
    gated, _, files = case
    model = load(files['hf'], gated)
    with torch.no_grad():
        (out, ) = model(torch.randn(1, 3, 70, 41))
    assert out.shape == (1, 64, 5, 3) and torch.isfinite(out).all()


def test_float16_is_refused_and_bfloat16_runs():
    """DINOv3 is released for bf16/fp32 only: fp16 weights or fp16 autocast raise, naming
    bf16; a trunk without RoPE runs in fp16."""
    from mmvitswin.core.compat import CPU_AUTOCAST_FP16
    x = torch.randn(1, 3, 32, 48)
    model = ViTAdapter(**ours_kwargs()).eval()
    with pytest.raises(ValueError, match='float16.*bfloat16'):
        model.half()(x.half())
    model.float()
    if CPU_AUTOCAST_FP16:
        with pytest.raises(ValueError, match='float16.*bfloat16'), \
                torch.autocast('cpu', dtype=torch.float16):
            model(x)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        assert torch.isfinite(model(x)[0]).all()
    plain = ViTAdapter(**ours_kwargs(rope_theta=None, abs_pos_embed=True)).eval().half()
    with torch.no_grad():
        assert plain(x.half())[0].dtype == torch.float16


def test_bf16_features_are_as_close_to_fp32_as_hf_bf16(case):
    """Under bf16 autocast ours stays as close to the fp32 features as HF's own bf16 run on
    the same weights (within 1 %: the RoPE tables are computed in fp32, LayerScale and the
    residual stream stay fp32, SDPA accumulates in fp32); both errors are those of bf16, not
    of a broken path."""
    gated, oracle, files = case
    model = load(files['hf'], gated)
    errs = {'ours': [], 'hf': []}
    for size in SIZES:
        x = torch.randn(2, 3, *size)
        want = hf_patch_tokens(oracle, x)
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
            (ours, ) = model(x)
            hf = hf_patch_tokens(oracle, x)
        errs['ours'].append(float((ours.float() - want).norm() / want.norm()))
        errs['hf'].append(float((hf.float() - want).norm() / want.norm()))
    mean = {k: sum(v) / len(v) for k, v in errs.items()}
    assert mean['ours'] <= 1.01 * mean['hf'], errs
    assert 1e-4 < mean['ours'] < 2e-2, errs  # bf16 round-off: present, and small


def test_interaction_adapter_on_dinov3_runs_with_registers(case):
    gated, _, files = case
    model = ViTAdapter(**ours_kwargs(gated, adapter='interaction',
                                     adapter_cfg=dict(num_heads=4, conv_inplane=8, n_points=2),
                                     init_cfg=dict(type='Pretrained', checkpoint=files['meta'])))
    model.init_weights()
    outs = model.eval()(torch.randn(1, 3, 70, 90))
    assert [tuple(o.shape) for o in outs] == [(1, 64, 18, 23), (1, 64, 9, 12), (1, 64, 5, 6),
                                              (1, 64, 3, 3)]


@pytest.mark.slow
def test_released_size_dinov3_b_preset_reproduces_hf(tmp_path):
    """DINOv3 ViT-B/16 at its released size (facebook/dinov3-vitb16-pretrain-lvd1689m's
    config) through the 'dinov3-b' preset and an HF snapshot directory."""
    cfg = transformers.DINOv3ViTConfig(hidden_size=768, intermediate_size=3072,
                                       num_hidden_layers=12, num_attention_heads=12,
                                       num_register_tokens=4, layerscale_value=1e-5,
                                       rope_theta=100.0, layer_norm_eps=1e-5, image_size=224)
    oracle = randomise(transformers.DINOv3ViTModel(cfg))
    files = save_layouts(oracle, tmp_path)
    model = ViTAdapter(arch='dinov3-b', init_cfg=dict(type='Pretrained', checkpoint=files['hf']))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        model.init_weights()
    for size in [(224, 224), (160, 288)]:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            (got, ) = model.eval()(x)
        assert max_rel_err(got, hf_patch_tokens(oracle, x)) < 1e-5


# ------------------------------------------------------------------- ViT-7B (dinov3-7b)
# The released 7B's structure (HF facebook/dinov3-vit7b16-pretrain-lvd1689m: hidden 4096,
# intermediate 8192, 40 layers, 32 heads, query/key/value bias off, gated SiLU MLP, 4 registers,
# rope_theta 100, eps 1e-5; Meta's dinov3_vit7b16: qkv_bias=False, 'swiglu64', untied local CLS
# norm; timm vit_7b_patch16_dinov3) with narrow widths: 64 wide, 2 heads of 32, 3 blocks.
SEVEN_B = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
               num_register_tokens=4, patch_size=16, image_size=64, layerscale_value=0.5,
               use_gated_mlp=True, hidden_act='silu', query_bias=False, key_bias=False,
               value_bias=False, proj_bias=True, mlp_bias=True, layer_norm_eps=1e-5,
               rope_theta=100.0)
SEVEN_B_SIZES = [(80, 112), (176, 48)]  # odd, non-square grids (5 x 7, 11 x 3)


def narrow_7b(**overrides) -> ViTAdapter:
    """The 'dinov3-7b' preset with only the widths narrowed: SwiGLU at twice the width, no
    q/k/v bias, registers, LayerScale, RoPE and norms all come from the preset."""
    return ViTAdapter(**dict(dict(arch='dinov3-7b', embed_dims=64, num_layers=3, num_heads=2),
                             **overrides))


def save_sharded_snapshot(model, root, shards: int = 2) -> str:
    """An HF snapshot as the hub ships the 7B: ``config.json``, ``model-0000i-of-0000n
    .safetensors`` shards and ``model.safetensors.index.json`` (``weight_map``: key -> shard)."""
    root.mkdir()
    model.config.save_pretrained(str(root))
    sd = hf_state(model)
    keys = list(sd)
    step = -(-len(keys) // shards)
    weight_map = {}
    for i in range(shards):
        name = f'model-{i + 1:05d}-of-{shards:05d}.safetensors'
        part = keys[i * step:(i + 1) * step]
        safetensors_torch.save_file({k: sd[k] for k in part}, str(root / name),
                                    metadata={'format': 'pt'})
        weight_map.update((k, name) for k in part)
    total = sum(v.numel() * v.element_size() for v in sd.values())
    (root / 'model.safetensors.index.json').write_text(json.dumps(
        {'metadata': {'total_size': total}, 'weight_map': weight_map}))
    return str(root)


@pytest.fixture(scope='module')
def seven_b(tmp_path_factory):
    """The narrow 7B-structured HF oracle and its files: a sharded HF snapshot, Meta's layout
    (bf16-rounded periods, the local CLS norm, no qkv bias) and timm's."""
    root = tmp_path_factory.mktemp('dinov3_7b')
    oracle = randomise(transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**SEVEN_B)))
    meta = root / 'dinov3_vit7b16_narrow_pretrain.pth'
    torch.save(to_meta(oracle, periods_dtype=torch.bfloat16, local_cls_norm=True), str(meta))
    timm = root / 'vit_7b_patch16_dinov3_narrow.safetensors'
    safetensors_torch.save_file(to_timm(oracle), str(timm))
    files = {'hf-sharded': save_sharded_snapshot(oracle, root / 'hf'), 'meta': str(meta),
             'timm': str(timm)}
    return oracle, files


def test_dinov3_7b_preset_is_the_released_model():
    """Full size on the meta device (no memory): HF's 7B config converted through our DINOv3
    family gives exactly our preset's tensors and shapes (HF's mask_token aside), and the
    parameter count is Meta's 6,716 M (dinov3#13)."""
    from mmvitswin.core.checkpoint.dinov3 import convert_dinov3_state_dict
    cfg = transformers.DINOv3ViTConfig(**dict(SEVEN_B, hidden_size=4096, intermediate_size=8192,
                                              num_hidden_layers=40, num_attention_heads=32,
                                              image_size=224, layerscale_value=1.0))
    with torch.device('meta'):
        hf = transformers.DINOv3ViTModel(cfg)
        ours = ViTAdapter(arch='dinov3-7b')
    assert (ours.embed_dims, ours.num_layers, ours.num_heads, ours.ffn_type,
            ours.feedforward_channels) == (4096, 40, 32, 'swiglu', 8192)
    assert ours.blocks[0].attn.qkv.bias is None and ours.rope_theta == 100.0
    assert ours.num_register_tokens == 4 and ours.pos_embed is None and ours.norm_eps == 1e-5
    assert sum(p.numel() for p in ours.parameters()) == 6_716_030_976
    converted, fmt = convert_dinov3_state_dict(hf_state(hf))
    assert fmt == 'hf'
    assert {k: v.shape for k, v in converted.items()} == {
        k: v.shape for k, v in ours.state_dict().items()}


@pytest.mark.parametrize('fmt', ['hf-sharded', 'meta', 'timm'])
def test_dinov3_7b_structure_reproduces_hf_from_each_layout(seven_b, fmt):
    oracle, files = seven_b
    if fmt == 'hf-sharded':  # the fixture is what it claims: two shards and their index
        index = json.loads(Path(files[fmt], 'model.safetensors.index.json').read_text())
        assert len(set(index['weight_map'].values())) == 2
    model = narrow_7b(init_cfg=dict(type='Pretrained', checkpoint=files[fmt]))
    assert model.blocks[0].attn.qkv.bias is None and model.feedforward_channels == 128
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # every tensor used, none missing
        model.init_weights()
    model.eval()
    for size in SEVEN_B_SIZES:
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            (got, ) = model(x)
        want = hf_patch_tokens(oracle, x)
        assert got.shape == want.shape == (2, 64, size[0] // 16, size[1] // 16)
        assert max_rel_err(got, want) < 1e-5, (fmt, size)


@pytest.mark.parametrize('fmt, overrides, field', [
    ('hf-sharded', dict(mlp_ratio=4.0), 'feedforward_channels'),
    ('hf-sharded', dict(num_layers=2), 'num_layers'),
    ('hf-sharded', dict(ffn_type='mlp'), 'ffn_type'),
    ('meta', dict(num_heads=4), 'num_heads'),
    ('meta', dict(rope_theta=1000.0), 'rope_theta'),
    ('timm', dict(num_register_tokens=0), 'num_register_tokens'),
])
def test_dinov3_7b_mismatch_is_a_named_error(seven_b, fmt, overrides, field):
    _, files = seven_b
    model = narrow_7b(init_cfg=dict(type='Pretrained', checkpoint=files[fmt]), **overrides)
    with pytest.raises(CheckpointError, match=field):
        model.init_weights()


def test_dinov3_with_qv_bias_into_the_7b_preset_is_refused(tmp_path):
    """An S+/H+-style file (non-zero q/v biases) does not fit the bias-free 7B preset: the
    error says what to build instead."""
    oracle = hf_model(gated=True)  # 64 wide, 4 heads, 4 blocks, SwiGLU 128: 7B-like widths
    path = tmp_path / 'dinov3_vitsplus_narrow.pth'
    torch.save(to_meta(oracle), str(path))
    model = narrow_7b(num_heads=4, num_layers=4,
                      init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match='qkv_bias=True'):
        model.init_weights()


@pytest.mark.parametrize('head_dim', [16, 64, 128])
def test_bf16_rounded_rope_periods_pass_and_other_thetas_do_not(head_dim):
    """Meta's released files hold the periods rounded to bf16: read back from one period,
    theta 100 looks like 103 (head dim 64) or 104 (128); compared as periods within bf16
    rounding they pass, while theta 110 or 1000 is refused by name."""
    from mmvitswin.core.checkpoint.dinov3 import check_rope_periods
    trunk = SimpleNamespace(embed_dims=2 * head_dim, num_heads=2, rope_theta=100.0)
    check_rope_periods(rope_periods(head_dim, 100.0).to(torch.bfloat16), trunk)
    for theta in (110.0, 1000.0):
        with pytest.raises(ValueError, match=r'rope_theta=\S+ \(fitted') as err:
            check_rope_periods(rope_periods(head_dim, theta).to(torch.bfloat16), trunk)
        fitted = float(str(err.value).split('rope_theta=')[1].split(' ')[0])
        assert abs(fitted / theta - 1) < 5e-3  # the message's theta is the file's


# -------------------------------------------------------------------------- mismatches
@pytest.mark.parametrize('overrides, field', [
    (dict(num_register_tokens=0), 'num_register_tokens'),
    (dict(rope_theta=None), 'rope'),
    (dict(rope_theta=10000.0), 'rope_theta'),
    # a ViT-B preset has no LayerScale: everything else DINOv3's
    (dict(arch='base', rope_theta=100.0, abs_pos_embed=False, num_register_tokens=4,
          final_norm=True, norm_cfg=dict(type='LN', eps=1e-5)), 'layer_scale'),
    (dict(num_heads=8), 'num_heads'),
    (dict(num_layers=3), 'num_layers'),
    (dict(abs_pos_embed=True), 'abs_pos_embed'),
    (dict(norm_cfg=dict(type='LN', eps=1e-6)), 'norm_eps'),
])
def test_architecture_mismatch_is_a_named_error(case, overrides, field):
    gated, _, files = case
    model = ViTAdapter(**ours_kwargs(gated, init_cfg=dict(type='Pretrained',
                                                          checkpoint=files['hf']), **overrides))
    with pytest.raises(CheckpointError, match=field):
        model.init_weights()


def test_meta_periods_tell_heads_and_theta(case):
    gated, _, files = case
    for overrides, field in ((dict(num_heads=8), 'num_heads'),
                             (dict(rope_theta=1000.0), 'rope_theta')):
        model = ViTAdapter(**ours_kwargs(gated, init_cfg=dict(type='Pretrained',
                                                              checkpoint=files['meta']),
                                         **overrides))
        with pytest.raises(CheckpointError, match=field):
            model.init_weights()


def test_ffn_kind_mismatch_is_refused(case):
    gated, _, files = case
    model = ViTAdapter(**ours_kwargs(not gated, init_cfg=dict(type='Pretrained',
                                                              checkpoint=files['timm'])))
    with pytest.raises(CheckpointError, match='ffn_type'):
        model.init_weights()


def test_nonzero_qkv_bias_into_a_model_without_one_is_an_error(case):
    gated, _, files = case
    model = ViTAdapter(**ours_kwargs(gated, qkv_bias=False,
                                     init_cfg=dict(type='Pretrained', checkpoint=files['meta'])))
    with pytest.raises(CheckpointError, match='qkv_bias=True'):
        model.init_weights()


def test_zero_biases_load_into_a_model_without_bias(tmp_path):
    oracle = hf_model()
    with torch.no_grad():
        for name, p in oracle.named_parameters():
            if 'attention' in name and name.endswith('bias') and 'o_proj' not in name:
                p.zero_()
    files = save_layouts(oracle, tmp_path)
    model = load(files['timm'], qkv_bias=False)
    x = torch.randn(1, 3, 48, 80)
    with torch.no_grad():
        (got, ) = model(x)
    assert max_rel_err(got, hf_patch_tokens(oracle, x)) < 1e-5


def test_hf_model_without_biases_loads_with_zero_biases(tmp_path):
    """query/value/proj/mlp_bias=False in config.json: no bias tensors in the file; a zero bias
    is the same as none, so the default model (with biases) reproduces it."""
    oracle = hf_model(query_bias=False, value_bias=False, proj_bias=False, mlp_bias=False)
    oracle.config.save_pretrained(str(tmp_path))
    safetensors_torch.save_file(hf_state(oracle), str(tmp_path / 'model.safetensors'))
    assert not any(k.endswith('proj.bias') for k in hf_state(oracle))
    model = load(str(tmp_path))
    x = torch.randn(1, 3, 48, 80)
    with torch.no_grad():
        (got, ) = model(x)
    assert max_rel_err(got, hf_patch_tokens(oracle, x)) < 1e-5


# ----------------------------------------------------------------------- presets, args
@pytest.mark.parametrize('arch, dims, depth, heads, ffn, hidden', [
    ('dinov3-s', 384, 12, 6, 'mlp', 1536),
    ('dinov3-b', 768, 12, 12, 'mlp', 3072),
    ('dinov3-l', 1024, 24, 16, 'mlp', 4096),
])
def test_presets_are_the_released_models(arch, dims, depth, heads, ffn, hidden):
    model = ViTAdapter(arch=arch, num_layers=1)  # one block: the widths are what matter
    assert (model.embed_dims, model.num_heads, model.ffn_type,
            model.feedforward_channels) == (dims, heads, ffn, hidden)
    assert model.num_register_tokens == 4 and model.rope_theta == 100.0
    assert model.layer_scale_init_value is not None and model.pos_embed is None
    assert model.patch_size == 16 and model.norm_eps == 1e-5 and model.with_cls_token
    from mmvitswin.core.backbones.vit import ARCH_ZOO
    assert ARCH_ZOO[arch]['num_layers'] == depth


def test_rope_arguments_are_checked():
    with pytest.raises(ValueError, match='rope_theta'):
        ViTAdapter(**ours_kwargs(rope_theta=-1.0))
    with pytest.raises(ValueError, match='window'):
        ViTAdapter(**ours_kwargs(window_size=2))  # RoPE is on global blocks only
    with pytest.raises(ValueError, match='head'):
        ViTAdapter(**ours_kwargs(embed_dims=40, num_heads=4))  # head_dim 10: not a multiple of 4


# -------------------------------------------------------------------- AMP / compile / ONNX
def small(**overrides) -> ViTAdapter:
    torch.manual_seed(0)
    return ViTAdapter(**ours_kwargs(drop_path_rate=0.1, **overrides))


@pytest.mark.parametrize('gated', [False, True])
def test_bf16_amp_is_finite_and_close_to_fp32(gated):
    """(fp16 is refused: test_float16_is_refused_and_bfloat16_runs)"""
    dtype = torch.bfloat16
    model = small(ffn_type='swiglu' if gated else 'mlp').eval()
    x = torch.randn(2, 3, 45, 77)
    with torch.no_grad():
        (ref, ) = model(x)
        with torch.autocast('cpu', dtype=dtype):
            (low, ) = model(x)
    assert torch.isfinite(low).all()
    assert max_rel_err(low.float(), ref) < 5e-2
    model.train()
    with torch.autocast('cpu', dtype=dtype):
        loss = model(x)[0].float().square().mean()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


# ----------------------------------------------------------------------------- configs
def _config(rel):
    pytest.importorskip('mmengine')
    import os.path as osp
    from mmengine.config import Config
    return Config.fromfile(osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), rel))


@pytest.mark.parametrize('rel, adapter, length, lr, wd, decay, dpr', [
    ('configs/mask_rcnn_vit_adapter_dinov3_b_coco_1x.py', 'interaction', 12, 1e-4, 0.05, 0.65,
     0.3),
    ('configs/mask_rcnn_vit_adapter_dinov3_b_coco_3x.py', 'interaction', 36, 1e-4, 0.05, 0.65,
     0.3),
    ('configs/mask_rcnn_vit_adapter_dinov3_b_simple_coco_1x.py', 'simple', 12, 1e-4, 0.1, 0.7,
     0.1),
    ('configs/mask_rcnn_vit_adapter_dinov3_b_simple_coco_3x.py', 'simple', 36, 1e-4, 0.1, 0.7,
     0.1),
    ('configs/upernet_vit_adapter_dinov3_b_ade20k.py', 'interaction', 160000, 6e-5, 0.01, 0.9,
     0.3),
    ('configs/upernet_vit_adapter_dinov3_b_simple_ade20k.py', 'simple', 160000, 1e-4, 0.05, 0.65,
     0.1),
])
def test_dinov3_configs_carry_the_published_recipes(rel, adapter, length, lr, wd, decay, dpr):
    """ViT-Adapter-B's (interaction) and ViTDet-B's / mmseg ViT-B's (simple) recipes on the
    DINOv3-B trunk: all blocks global (the RoPE), layer-wise decay over 12 blocks, lr schedule
    length. (Every config also builds and predicts in tests/test_configs.py.)"""
    cfg = _config(rel)
    bb = cfg.model.backbone
    assert (bb.type, bb.arch, bb.adapter, bb.drop_path_rate) == ('ViTAdapter', 'dinov3-b',
                                                                 adapter, dpr)
    assert bb.get('window_size', 0) == 0 and 'with_cls_token' not in bb  # CLS + registers kept
    assert bb.init_cfg.type == 'Pretrained'
    if adapter == 'interaction':
        assert bb.adapter_cfg.interaction_indexes == [(0, 3), (3, 6), (6, 9), (9, 12)]
    opt = cfg.optim_wrapper
    assert opt.constructor == 'LayerDecayOptimWrapperConstructor'
    assert (opt.optimizer.type, opt.optimizer.lr, opt.optimizer.weight_decay) == ('AdamW', lr, wd)
    assert (opt.paramwise_cfg.num_layers, opt.paramwise_cfg.layer_decay_rate) == (12, decay)
    if cfg.default_scope == 'mmdet':
        assert cfg.train_cfg.max_epochs == length
        assert cfg.param_scheduler[-1].milestones == ([8, 11] if length == 12 else [27, 33])
        channels = 768 if adapter == 'interaction' else 256
        assert cfg.model.neck.in_channels == [channels] * 4
    else:
        assert cfg.train_cfg.max_iters == length

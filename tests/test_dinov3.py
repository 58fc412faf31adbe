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
"""
import warnings

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


def to_meta(model) -> dict:
    sd = hf_state(model)
    dim = model.config.hidden_size
    out = {'cls_token': sd['embeddings.cls_token'],
           'storage_tokens': sd['embeddings.register_tokens'],
           'mask_token': sd['embeddings.mask_token'].reshape(1, dim),
           'patch_embed.proj.weight': sd['embeddings.patch_embeddings.weight'],
           'patch_embed.proj.bias': sd['embeddings.patch_embeddings.bias'],
           'rope_embed.periods': rope_periods(dim // model.config.num_attention_heads,
                                              model.config.rope_theta),
           'norm.weight': sd['norm.weight'], 'norm.bias': sd['norm.bias']}
    for i in range(model.config.num_hidden_layers):
        p = f'layer.{i}.'
        b = f'blocks.{i}.'
        att = p + 'attention.'
        out[b + 'attn.qkv.weight'] = torch.cat([sd[att + f'{n}_proj.weight'] for n in 'qkv'])
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
        if k.endswith(('bias_mask', 'periods')) or k == 'mask_token':
            continue
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
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_amp_is_finite_and_close_to_fp32(gated, dtype):
    from mmvitswin.core.compat import CPU_AUTOCAST_FP16
    if dtype == torch.float16 and not CPU_AUTOCAST_FP16:
        pytest.skip('fp16 autocast on CPU needs a newer torch')
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

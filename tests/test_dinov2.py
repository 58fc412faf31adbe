"""DINOv2 and plain HF ViT trunks against HuggingFace ``transformers`` as the oracle.

Random-weight HF models (``Dinov2Model``, ``Dinov2WithRegistersModel``, ``ViTModel``; small
widths, plus DINOv2-S at its released size once) are saved in every layout users download:
an HF snapshot directory (``save_pretrained``: ``config.json`` + ``model.safetensors`` with the
hub's key names), a bare ``.safetensors`` with the ``dinov2.``/``vit.`` prefix of the
``*ForImageClassification`` files, the key names of ``transformers >= 5``, timm's layout
(``vit_*_dinov2``, ``vit_*_reg4_dinov2``: written here by renaming, timm cannot be imported on
this machine) and Meta's ``.pth``. Our backbone loads each through
``init_cfg=dict(type='Pretrained', checkpoint=...)`` and must reproduce HF's tokens at three
sizes (square, non-square, far from the pretraining grid: multiples of the patch, where HF
takes the whole image). Files the model cannot represent raise a ``CheckpointError`` naming
the field. The pyramid (``adapter='simple'|'interaction'``) on a patch-14 trunk is checked for
shapes at odd sizes and for keeping the trunk's tokens exactly.
"""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip('transformers')

from conftest import max_rel_err  # noqa: E402
from mmvitswin.core.backbones.vit import ViTAdapter, resample_stride_to_16  # noqa: E402
from mmvitswin.core.checkpoint import CheckpointError  # noqa: E402
from mmvitswin.core.layers import resize_abs_pos_embed, swiglu_hidden_dims  # noqa: E402

WIDTH, DEPTH, HEADS, IMG = 32, 2, 2, 56  # a 4 x 4 pretraining grid of patch 14
SIZES = [(56, 56), (42, 70), (126, 98)]  # on the grid, non-square, far from it (9 x 7)


# ------------------------------------------------------------------------------ HF models
def _perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial LayerScale, norms, biases and tokens (HF inits some to 1 or 0), so that a
    swapped or dropped key shows in the features."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(('lambda1', 'bias', 'cls_token', 'register_tokens')) or (
                    'norm' in name and name.endswith('weight')):
                p.copy_(p + 0.3 * torch.randn(p.shape, generator=gen))
    return model.eval()


def hf_dinov2(registers: int = 0, swiglu: bool = False, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = dict(hidden_size=WIDTH, num_hidden_layers=DEPTH, num_attention_heads=HEADS,
               image_size=IMG, patch_size=14, use_swiglu_ffn=swiglu)
    cfg.update(overrides)
    if registers:
        config = transformers.Dinov2WithRegistersConfig(num_register_tokens=registers, **cfg)
        return _perturb(transformers.Dinov2WithRegistersModel(config), seed)
    return _perturb(transformers.Dinov2Model(transformers.Dinov2Config(**cfg)), seed)


def hf_vit(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.ViTConfig(hidden_size=WIDTH, num_hidden_layers=DEPTH,
                                    num_attention_heads=HEADS, intermediate_size=3 * WIDTH,
                                    image_size=64, patch_size=16)
    return _perturb(transformers.ViTModel(config, add_pooling_layer=False), seed)


def hf_tokens(model, x: torch.Tensor) -> torch.Tensor:
    """HF's final (layer-normed) patch tokens as a map (B, C, h, w)."""
    kwargs = dict(interpolate_pos_encoding=True) if isinstance(model, transformers.ViTModel) \
        else {}
    with torch.no_grad():
        seq = model(pixel_values=x, **kwargs).last_hidden_state
    prefix = 1 + getattr(model.config, 'num_register_tokens', 0)
    p = model.config.patch_size
    h, w = x.shape[-2] // p, x.shape[-1] // p
    return seq[:, prefix:].transpose(1, 2).reshape(x.shape[0], -1, h, w)


# ---------------------------------------------------------------------- layouts (test side)
def save_snapshot(model, path) -> str:
    model.save_pretrained(str(path))
    assert (path / 'config.json').exists() and (path / 'model.safetensors').exists()
    return str(path)


def _hub_keys(model, tmp_path) -> dict:
    """The hub's key names (what ``save_pretrained`` writes), read back from a snapshot."""
    d = tmp_path / 'hub_keys'
    model.save_pretrained(str(d))
    return load_file(str(d / 'model.safetensors'))


def to_timm(hub: dict, registers: int = 0, swiglu: bool = False) -> dict:
    """HF hub names -> timm's ``vit_*_dinov2`` / ``vit_*_reg4_dinov2`` layout: joined qkv,
    ``ls1/ls2.gamma``, ``mlp.fc1/fc2`` (SwiGLU packed for ViT-g), ``reg_token`` and, with
    registers, ``no_embed_class`` (pos-embed without its CLS entry, folded into cls_token)."""
    out = {}
    pos = hub['embeddings.position_embeddings']
    cls = hub['embeddings.cls_token']
    if registers:
        out['pos_embed'] = pos[:, 1:].clone()
        out['cls_token'] = cls + pos[:, :1]
        out['reg_token'] = hub['embeddings.register_tokens']
    else:
        out['pos_embed'], out['cls_token'] = pos, cls
    out['patch_embed.proj.weight'] = hub['embeddings.patch_embeddings.projection.weight']
    out['patch_embed.proj.bias'] = hub['embeddings.patch_embeddings.projection.bias']
    for i in range(DEPTH):
        src, dst = f'encoder.layer.{i}.', f'blocks.{i}.'
        for kind in ('weight', 'bias'):
            out[dst + f'norm1.{kind}'] = hub[src + f'norm1.{kind}']
            out[dst + f'norm2.{kind}'] = hub[src + f'norm2.{kind}']
            out[dst + f'attn.qkv.{kind}'] = torch.cat([
                hub[src + f'attention.attention.{n}.{kind}'] for n in ('query', 'key', 'value')])
            out[dst + f'attn.proj.{kind}'] = hub[src + f'attention.output.dense.{kind}']
            if swiglu:
                out[dst + f'mlp.fc1.{kind}'] = hub[src + f'mlp.weights_in.{kind}']
                out[dst + f'mlp.fc2.{kind}'] = hub[src + f'mlp.weights_out.{kind}']
            else:
                out[dst + f'mlp.fc1.{kind}'] = hub[src + f'mlp.fc1.{kind}']
                out[dst + f'mlp.fc2.{kind}'] = hub[src + f'mlp.fc2.{kind}']
        out[dst + 'ls1.gamma'] = hub[src + 'layer_scale1.lambda1']
        out[dst + 'ls2.gamma'] = hub[src + 'layer_scale2.lambda1']
    out['norm.weight'], out['norm.bias'] = hub['layernorm.weight'], hub['layernorm.bias']
    return {k: v.contiguous() for k, v in out.items()}


def to_meta(hub: dict, registers: int = 0, swiglu: bool = False) -> dict:
    """HF hub names -> Meta's released DINOv2 .pth: timm-like blocks, the CLS entry kept in
    ``pos_embed``, ``register_tokens``, ``mask_token``, SwiGLU as ``mlp.w12/w3``."""
    out = to_timm(hub, 0, swiglu)
    if registers:
        out['register_tokens'] = hub['embeddings.register_tokens']
    out['mask_token'] = hub['embeddings.mask_token']
    if swiglu:
        for key in list(out):
            if '.mlp.fc1.' in key or '.mlp.fc2.' in key:
                out[key.replace('mlp.fc1.', 'mlp.w12.').replace('mlp.fc2.', 'mlp.w3.')] = \
                    out.pop(key)
    return out


# ------------------------------------------------------------------------------ our model
def ours(path, registers: int = 0, swiglu: bool = False, rule: str = 'bicubic', **kwargs):
    hidden = swiglu_hidden_dims(WIDTH) if swiglu else 4 * WIDTH
    cfg = dict(arch=dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS,
                         feedforward_channels=hidden),
               patch_size=14, img_size=IMG, layer_scale_init_value=1e-5, final_norm=True,
               num_register_tokens=registers, ffn_type='swiglu' if swiglu else 'mlp',
               pos_embed_resize=rule, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    cfg.update(kwargs)
    model = ViTAdapter(**cfg)
    model.init_weights()
    return model.eval()


def assert_matches(model, ref, sizes=SIZES, tol=1e-5, batch=2):
    torch.manual_seed(1)
    for size in sizes:
        x = torch.randn(batch, 3, *size)
        with torch.no_grad():
            got, = model(x)
        want = hf_tokens(ref, x)
        assert got.shape == want.shape, size
        assert max_rel_err(got, want) <= tol, (size, max_rel_err(got, want))


# --------------------------------------------------------------------------- DINOv2 layouts
@pytest.mark.parametrize('registers,swiglu', [(0, False), (2, False), (0, True)],
                         ids=['dinov2', 'dinov2-reg', 'dinov2-swiglu'])
def test_hf_snapshot_dir_reproduces_hf(tmp_path, registers, swiglu):
    ref = hf_dinov2(registers, swiglu)
    path = save_snapshot(ref, tmp_path / 'snapshot')
    rule = 'bicubic-antialias' if registers else 'bicubic'  # HF's own run-time rules
    assert_matches(ours(path, registers, swiglu, rule), ref)


def test_hf_prefixed_and_transformers5_names_reproduce_hf(tmp_path):
    ref = hf_dinov2(registers=2, swiglu=True)
    hub = _hub_keys(ref, tmp_path)
    prefixed = {'dinov2.' + k: v for k, v in hub.items()}
    prefixed.update({'classifier.weight': torch.zeros(5, 2 * WIDTH),
                     'classifier.bias': torch.zeros(5)})
    save_file(prefixed, str(tmp_path / 'cls.safetensors'))
    with pytest.warns(UserWarning, match='classifier'):  # reported, not silently taken
        model = ours(tmp_path / 'cls.safetensors', 2, True, 'bicubic-antialias')
    assert_matches(model, ref)
    # transformers >= 5 module names (q_proj, gate_proj/up_proj, ...): state_dict() itself
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()},
              str(tmp_path / 'new.safetensors'))
    assert_matches(ours(tmp_path / 'new.safetensors', 2, True, 'bicubic-antialias'), ref)


@pytest.mark.parametrize('registers,swiglu', [(0, False), (4, False), (0, True)],
                         ids=['vit_dinov2', 'vit_reg4_dinov2', 'vit_giant_dinov2'])
def test_timm_layout_reproduces_hf(tmp_path, registers, swiglu):
    ref = hf_dinov2(registers, swiglu, seed=2)
    sd = to_timm(_hub_keys(ref, tmp_path), registers, swiglu)
    path = tmp_path / 'model.safetensors'
    save_file(sd, str(path))
    rule = 'bicubic-antialias' if registers else 'bicubic'
    assert_matches(ours(path, registers, swiglu, rule), ref)


@pytest.mark.parametrize('names', ['timm', 'facebook'])
def test_deit3_layout_reproduces_its_model(tmp_path, names):
    """DeiT-III (timm's ``deit3_*``: LayerScale, ``no_embed_class``; Facebook's original names
    ``gamma_1/gamma_2``) at patch 16: the oracle is HF's Dinov2 block stack (the same
    architecture) with a zero CLS position, which is what ``no_embed_class`` means."""
    ref = hf_dinov2(seed=5, patch_size=16, image_size=64)
    with torch.no_grad():
        ref.embeddings.position_embeddings[:, 0] = 0
    sd = to_timm(_hub_keys(ref, tmp_path))
    sd['pos_embed'] = sd['pos_embed'][:, 1:].contiguous()  # no CLS entry
    if names == 'facebook':
        sd = {k.replace('ls1.gamma', 'gamma_1').replace('ls2.gamma', 'gamma_2'): v
              for k, v in sd.items()}
    path = tmp_path / 'deit3.pth'
    torch.save({'model': sd}, path)
    model = ours(path, patch_size=16, img_size=64)
    assert_matches(model, ref, [(64, 64), (48, 80), (128, 96)])


@pytest.mark.parametrize('registers,swiglu', [(0, False), (4, True)])
def test_meta_pth_reproduces_hf(tmp_path, registers, swiglu):
    ref = hf_dinov2(registers, swiglu, seed=3)
    sd = to_meta(_hub_keys(ref, tmp_path), registers, swiglu)
    path = tmp_path / 'dinov2_vits14_pretrain.pth'
    torch.save(sd, path)
    rule = 'bicubic-antialias' if registers else 'bicubic'
    assert_matches(ours(path, registers, swiglu, rule), ref)


@pytest.mark.slow(reason="a released-size DINOv2-S beside HF's")
def test_released_size_dinov2_s(tmp_path):
    """DINOv2-S as released (384 wide, 12 blocks, 518 px) through the 'dinov2-s' preset, at a
    size far from its 37 x 37 grid."""
    torch.manual_seed(0)
    ref = _perturb(transformers.Dinov2Model(transformers.Dinov2Config(
        hidden_size=384, num_hidden_layers=12, num_attention_heads=6, image_size=518,
        patch_size=14)))
    path = save_snapshot(ref, tmp_path / 'facebook--dinov2-small')
    model = ViTAdapter(arch='dinov2-s', init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    assert_matches(model.eval(), ref, [(168, 224), (518, 518), (112, 154)], batch=1)


# ------------------------------------------------------------------------------- HF ViTModel
def test_hf_vit_snapshot_and_prefixed_reproduce_hf(tmp_path):
    ref = hf_vit()
    path = save_snapshot(ref, tmp_path / 'vit')
    kwargs = dict(patch_size=16, img_size=64, layer_scale_init_value=None,
                  norm_cfg=dict(type='LN', eps=1e-12), arch=dict(
                      embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS,
                      feedforward_channels=3 * WIDTH))
    sizes = [(64, 64), (48, 80), (160, 112)]
    assert_matches(ours(path, **kwargs), ref, sizes)
    hub = _hub_keys(ref, tmp_path)
    save_file({'vit.' + k: v for k, v in hub.items()}, str(tmp_path / 'vit.safetensors'))
    assert_matches(ours(tmp_path / 'vit.safetensors', **kwargs), ref, sizes)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()},
              str(tmp_path / 'new.safetensors'))
    assert_matches(ours(tmp_path / 'new.safetensors', **kwargs), ref, sizes)
    # its config says LayerNorm eps 1e-12: a model with timm's 1e-6 is refused by name
    with pytest.raises(CheckpointError, match='norm_eps'):
        ours(path, **dict(kwargs, norm_cfg=dict(type='LN', eps=1e-6)))


# --------------------------------------------------------------------- files that do not fit
def test_unrepresentable_files_raise_named_errors(tmp_path):
    ref = hf_dinov2(registers=2)
    snapshot = save_snapshot(ref, tmp_path / 'snap')
    hub = _hub_keys(ref, tmp_path)
    timm_path = tmp_path / 'timm.safetensors'
    save_file(to_timm(hub, 2), str(timm_path))
    # LayerScale gammas into blocks without LayerScale (the 0.77-error case of the issue)
    with pytest.raises(CheckpointError, match='layer_scale'):
        ours(timm_path, 2, layer_scale_init_value=None)
    # register tokens into a model without them, and the other way round
    with pytest.raises(CheckpointError, match='num_register_tokens'):
        ours(timm_path, 0)
    with pytest.raises(CheckpointError, match='num_register_tokens'):
        ours(snapshot, 4)
    # heads: only config.json says it
    with pytest.raises(CheckpointError, match='num_heads'):
        ours(snapshot, 2, arch=dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=4,
                                    feedforward_channels=4 * WIDTH))
    # depth, and FFN kind
    with pytest.raises(CheckpointError, match='num_layers'):
        ours(timm_path, 2, arch=dict(embed_dims=WIDTH, num_layers=3, num_heads=HEADS,
                                     feedforward_channels=4 * WIDTH))
    with pytest.raises(CheckpointError, match='ffn_type'):
        ours(timm_path, 2, swiglu=True)
    # a plain ViT (no LayerScale) into a DINOv2 model: the gammas would stay at 1e-5
    vit_path = save_snapshot(hf_vit(), tmp_path / 'vit')
    with pytest.raises(CheckpointError, match='layer_scale'):
        ours(vit_path, 0, patch_size=16, img_size=64, norm_cfg=dict(type='LN', eps=1e-12),
             arch=dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS,
                       feedforward_channels=3 * WIDTH))


def test_config_json_is_checked_against_the_model(tmp_path):
    """A snapshot whose config.json disagrees with its tensors' model (here: registers) is
    refused by the config check even where the keys alone would pass."""
    ref = hf_dinov2()
    path = tmp_path / 'snap'
    save_snapshot(ref, path)
    config = json.loads((path / 'config.json').read_text())
    config['num_attention_heads'] = 1
    (path / 'config.json').write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match='num_heads=1'):
        ours(str(path))


# --------------------------------------------------------------------- pos-embed resize rules
def test_pos_embed_rules_match_their_implementations():
    torch.manual_seed(0)
    pos = torch.randn(1, 16, 8)  # a 4 x 4 grid
    grid = pos.reshape(1, 4, 4, 8).permute(0, 3, 1, 2)

    def flat(g):
        return g.permute(0, 2, 3, 1).reshape(1, -1, 8)

    dst = (3, 7)
    plain = F.interpolate(grid, size=dst, mode='bicubic', align_corners=False)
    anti = F.interpolate(grid, size=dst, mode='bicubic', align_corners=False, antialias=True)
    # Meta's DINOv2 (interpolate_offset=0.1): scale factors (n + 0.1) / M
    meta = F.interpolate(grid, scale_factor=((3 + 0.1) / 4, (7 + 0.1) / 4), mode='bicubic')
    assert torch.equal(resize_abs_pos_embed(pos, (4, 4), dst, 'bicubic'), flat(plain))
    # (computed as per-axis weight matrices: equal up to fp32 summation order)
    assert max_rel_err(resize_abs_pos_embed(pos, (4, 4), dst, 'bicubic-antialias'),
                       flat(anti)) < 1e-5
    for src, dst2 in (((37, 37), (16, 23)), ((16, 16), (37, 29)), ((5, 9), (1, 1))):
        table = torch.randn(1, 8, *src)
        want = F.interpolate(table, size=dst2, mode='bicubic', align_corners=False,
                             antialias=True)
        got = resize_abs_pos_embed(flat(table), src, dst2, 'bicubic-antialias')
        assert max_rel_err(got, flat(want)) < 1e-5, (src, dst2)
    # (computed as a grid_sample at the same positions: equal up to fp32 coordinate rounding)
    assert max_rel_err(resize_abs_pos_embed(pos, (4, 4), dst, 'bicubic-offset'),
                       flat(meta)) < 1e-5
    big = F.interpolate(grid, scale_factor=((37 + 0.1) / 4, (29 + 0.1) / 4), mode='bicubic')
    assert max_rel_err(resize_abs_pos_embed(pos, (4, 4), (37, 29), 'bicubic-offset'),
                       flat(big)) < 1e-5
    assert max_rel_err(flat(anti), flat(plain)) > 1e-3  # the rules do differ off the grid
    assert max_rel_err(flat(meta), flat(plain)) > 1e-3
    assert resize_abs_pos_embed(pos, (4, 4), (4, 4), 'bicubic-antialias') is pos
    with pytest.raises(ValueError, match='rule'):
        resize_abs_pos_embed(pos, (4, 4), dst, 'nearest')


def test_timm_rule_on_loading_differs_from_plain(tmp_path):
    """A timm file with another grid is fitted to the model's grid by timm's antialiased
    bicubic (its checkpoint_filter_fn), an HF file by plain bicubic (HF's rule)."""
    ref = hf_dinov2(seed=4)
    hub = _hub_keys(ref, tmp_path)
    save_file(to_timm(hub), str(tmp_path / 'timm.safetensors'))
    model = ours(tmp_path / 'timm.safetensors', img_size=98)  # 4 x 4 -> 7 x 7
    grid = hub['embeddings.position_embeddings'][:, 1:].reshape(1, 4, 4, WIDTH)
    want = F.interpolate(grid.permute(0, 3, 1, 2), size=(7, 7), mode='bicubic',
                         align_corners=False, antialias=True)
    torch.testing.assert_close(model.pos_embed[:, 1:].detach(),
                               want.permute(0, 2, 3, 1).reshape(1, 49, WIDTH))
    hf_model = ours(save_snapshot(ref, tmp_path / 'snap'), img_size=98)
    want = F.interpolate(grid.permute(0, 3, 1, 2), size=(7, 7), mode='bicubic',
                         align_corners=False)
    torch.testing.assert_close(hf_model.pos_embed[:, 1:].detach(),
                               want.permute(0, 2, 3, 1).reshape(1, 49, WIDTH))


# ------------------------------------------------------------------------------ presets
@pytest.mark.parametrize('arch,dims,depth,heads,regs,ffn,hidden', [
    ('dinov2-s', 384, 12, 6, 0, 'mlp', 1536), ('dinov2-b-reg', 768, 12, 12, 4, 'mlp', 3072),
    ('dinov2-l', 1024, 24, 16, 0, 'mlp', 4096), ('dinov2-g-reg', 1536, 40, 24, 4, 'swiglu', 4096)])
def test_presets_have_the_released_defaults(arch, dims, depth, heads, regs, ffn, hidden):
    """Checked on the meta device (no memory for ViT-g's weights)."""
    with torch.device('meta'):
        model = ViTAdapter(arch=arch)
    assert (model.embed_dims, model.num_layers, model.num_heads) == (dims, depth, heads)
    assert model.patch_size == 14 and model.img_size == (518, 518)
    assert model.pretrain_grid == (37, 37) and model.pos_embed.shape == (1, 1 + 37 * 37, dims)
    assert model.num_register_tokens == regs and model.num_prefix_tokens == 1 + regs
    assert model.ffn_type == ffn and model.feedforward_channels == hidden
    assert model.layer_scale_init_value == 1e-5 and model.norm is not None
    assert model.pos_embed_resize == ('bicubic-antialias' if regs else 'bicubic')
    if ffn == 'swiglu':
        assert swiglu_hidden_dims(dims) == hidden == model.blocks[0].ffn.w3.in_features


def test_layer_scale_and_registers_train_and_decay():
    model = ViTAdapter(arch=dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS,
                                 feedforward_channels=4 * WIDTH), patch_size=14, img_size=IMG,
                       layer_scale_init_value=1e-5, num_register_tokens=2, frozen_stages=0)
    assert torch.equal(model.blocks[0].ls1.gamma.detach(), torch.full((WIDTH, ), 1e-5))
    assert model.get_layer_depth('register_tokens') == 0
    assert model.get_layer_depth('blocks.1.ls2.gamma') == 2
    assert not model.register_tokens.requires_grad  # frozen with the embedding
    model = ViTAdapter(arch=dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS,
                                 feedforward_channels=4 * WIDTH), patch_size=14, img_size=IMG,
                       layer_scale_init_value=1e-5, num_register_tokens=2).train()
    sum(o.sum() for o in model(torch.randn(1, 3, 43, 57))).backward()
    for p in (model.register_tokens, model.blocks[1].ls2.gamma, model.blocks[0].ls1.gamma):
        assert p.grad is not None and p.grad.abs().sum() > 0


# ------------------------------------------------------------------ pyramids from patch 14
def test_stride_14_map_resampled_by_image_position():
    """A map linear in the image position (value = x pixel of the cell centre) resampled to
    stride 16 reads the position of the stride-16 cell centres (bilinear is exact on it)."""
    w = 10
    centres = (torch.arange(w, dtype=torch.float32) + 0.5) * 14
    x = centres.view(1, 1, 1, w).expand(1, 1, 3, w).contiguous()
    out = resample_stride_to_16(x, 14)
    assert out.shape[-1] == w * 14 // 16
    want = (torch.arange(out.shape[-1], dtype=torch.float32) + 0.5) * 16
    inner = slice(1, out.shape[-1] - 1)  # away from the border clamp
    torch.testing.assert_close(out[0, 0, 0, inner], want[inner])


@pytest.mark.parametrize('adapter', ['simple', 'interaction'])
def test_patch14_pyramid_keeps_the_pretrained_tokens(tmp_path, adapter):
    """ViTAdapter on a DINOv2 trunk: strides 4/8/16/32 at odd sizes, and its trunk is still
    the pretrained model (its stride-14 tokens equal HF's on a padded-to-whole-patch input)."""
    ref = hf_dinov2(registers=2)
    path = save_snapshot(ref, tmp_path / 'snap')
    cfg = dict(adapter=adapter, adapter_cfg=dict(out_channels=16) if adapter == 'simple' else
               dict(num_heads=2, conv_inplane=8, n_points=2,
                    interaction_indexes=[(0, 1), (1, 2)]))
    model = ours(path, 2, rule='bicubic-antialias', **cfg)
    for size in [(45, 77), (37, 53), (70, 70)]:
        with torch.no_grad():
            outs = model(torch.randn(1, 3, *size))
        c = 16 if adapter == 'simple' else WIDTH
        assert [tuple(o.shape) for o in outs] == [
            (1, c, math.ceil(size[0] / s), math.ceil(size[1] / s)) for s in (4, 8, 16, 32)]
        assert all(torch.isfinite(o).all() for o in outs)
    x = torch.randn(1, 3, 64, 96)  # padded to 70 x 98 inside the trunk: 5 x 7 patches
    with torch.no_grad():
        seq, grid = model.prepare_tokens(x)
        for block in model.blocks:
            seq = block(seq, grid, model.num_prefix_tokens)
        ours_tokens = model.seq_to_map(model.norm(seq), grid)
    want = hf_tokens(ref, F.pad(x, (0, 2, 0, 6)))
    assert max_rel_err(ours_tokens, want) <= 1e-5


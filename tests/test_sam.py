"""SAM's image encoder on our ViT trunk, against HuggingFace ``transformers`` as the oracle.

Random-weight ``SamVisionModel`` / ``SamModel`` (small widths, built from a config: nothing is
downloaded) are saved in every layout users download: an HF snapshot directory
(``config.json`` + ``model.safetensors``), Meta's ``sam_vit_*.pth`` (a whole SAM:
``image_encoder.*`` beside the prompt encoder and mask decoder) and timm's ``samvit_*``
(``.safetensors``). Our ``ViTAdapter(arch='sam-b', neck='sam', ...)`` loads each through
``init_cfg=dict(type='Pretrained', ...)`` and must reproduce the oracle's neck output.

Sizes. HF's encoder refuses any input but its configured ``image_size`` (and its position
embedding is a fixed grid), so it is compared as is at that size. At other sizes (non-square,
and one far from the pretraining grid) the oracle is the same HF encoder with its size check
moved and its position grid replaced by the bicubic resize ViTDet's ``get_abs_pos`` applies
(plain bicubic, no antialias: our rule for SAM); its decomposed relative positions are
resized by HF's own ``get_rel_pos`` at run time, windows padded by HF's own code.
"""
import os.path as osp
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import max_rel_err
from mmvitswin.core.backbones.vit import ViTAdapter
from mmvitswin.core.checkpoint import CheckpointError
from mmvitswin.core.layers import SamNeck

transformers = pytest.importorskip('transformers')
safetensors_torch = pytest.importorskip('safetensors.torch')

IMG = 128  # pretraining size of the small encoder: an 8 x 8 grid, windows of 3 (padded to 9)
SMALL = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, image_size=IMG,
             patch_size=16, window_size=3, global_attn_indexes=[1, 3], output_channels=32)


def ours_kwargs(**overrides) -> dict:
    cfg = dict(arch='sam-b', embed_dims=64, num_layers=4, num_heads=4, img_size=IMG,
               window_size=3, global_attn_indexes=(1, 3), neck='sam',
               neck_cfg=dict(out_channels=32))
    cfg.update(overrides)
    if cfg['neck'] is None:
        cfg.pop('neck_cfg')
    return cfg


def randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial weights everywhere (HF zero-initialises positions and biases)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            if 'norm' in name and name.endswith('weight'):
                p.add_(1.0)
    return model.eval()


def hf_vision(**overrides):
    cfg = transformers.SamVisionConfig(**dict(SMALL, **overrides))
    return randomise(transformers.SamVisionModel(cfg))


def hf_neck_output(encoder, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return encoder(x).last_hidden_state


def hf_at_size(model, size):
    """A copy of the HF encoder that runs at ``size``: its position grid resized as ViTDet's
    get_abs_pos does (bicubic, align_corners=False, no antialias), the size check moved. The
    relative-position tables stay: HF's get_rel_pos resizes them linearly at run time."""
    import copy
    model = copy.deepcopy(model)
    enc = model.vision_encoder
    grid = (size[0] // 16, size[1] // 16)
    pos = enc.pos_embed.detach().permute(0, 3, 1, 2)
    pos = F.interpolate(pos, size=grid, mode='bicubic', align_corners=False)
    enc.pos_embed = nn.Parameter(pos.permute(0, 2, 3, 1))
    enc.patch_embed.image_size = tuple(size)
    return model


def to_meta(sd: dict) -> dict:
    """HF SamVisionModel keys -> Meta's segment_anything names (whole-SAM file)."""
    out = {}
    for k, v in sd.items():
        k = k.replace('vision_encoder.', 'image_encoder.').replace('patch_embed.projection',
                                                                    'patch_embed.proj')
        k = k.replace('.layers.', '.blocks.').replace('layer_norm1', 'norm1')
        k = k.replace('layer_norm2', 'norm2')
        k = k.replace('neck.conv1', 'neck.0').replace('neck.norm1', 'neck.1')
        k = k.replace('neck.conv2', 'neck.2').replace('neck.norm2', 'neck.3')
        out[k] = v
    # the rest of a whole SAM: taken by nobody
    out['prompt_encoder.point_embeddings.0.weight'] = torch.randn(1, 32)
    out['mask_decoder.iou_token.weight'] = torch.randn(1, 32)
    return out


def to_timm(sd: dict) -> dict:
    meta = to_meta(sd)
    return {k[len('image_encoder.'):].replace('mlp.lin', 'mlp.fc'): v for k, v in meta.items()
            if k.startswith('image_encoder.')}


@pytest.fixture(scope='module')
def oracle():
    return hf_vision()


@pytest.fixture(scope='module')
def files(oracle, tmp_path_factory):
    root = tmp_path_factory.mktemp('sam')
    sd = {k: v.contiguous() for k, v in oracle.state_dict().items()}
    snap = root / 'hf-sam-vision'
    snap.mkdir()
    oracle.config.save_pretrained(str(snap))
    safetensors_torch.save_file(sd, str(snap / 'model.safetensors'))
    meta = root / 'sam_vit_b_tiny.pth'
    torch.save(to_meta(sd), str(meta))
    timm = root / 'samvit_tiny.safetensors'
    safetensors_torch.save_file(to_timm(sd), str(timm))
    return dict(hf=str(snap), meta=str(meta), timm=str(timm))


def load(path: str, **overrides) -> ViTAdapter:
    model = ViTAdapter(**ours_kwargs(init_cfg=dict(type='Pretrained', checkpoint=path),
                                     **overrides))
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # nothing left over, nothing missing
        model.init_weights()
    return model.eval()


# ----------------------------------------------------------------------------- the neck
def test_neck_matches_hf_sam_vision_neck():
    from transformers.models.sam.modeling_sam import SamVisionNeck
    hf = randomise(SamVisionNeck(transformers.SamVisionConfig(hidden_size=48,
                                                              output_channels=24)))
    ours = SamNeck(48, 24)
    names = {'conv1': '0', 'layer_norm1': '1', 'conv2': '2', 'layer_norm2': '3'}
    ours.load_state_dict({names[k.split('.')[0]] + k[k.index('.'):]: v
                          for k, v in hf.state_dict().items()})
    x = torch.randn(2, 5, 7, 48)  # HF's neck takes NHWC
    with torch.no_grad():
        want = hf(x)
        got = ours(x.permute(0, 3, 1, 2))
    assert got.shape == (2, 24, 5, 7) and got.is_contiguous()
    assert max_rel_err(got, want) < 1e-6
    with pytest.raises(ValueError, match='in_channels'):
        SamNeck(0)


# ------------------------------------------------------------------------------ parity
@pytest.mark.parametrize('fmt', ['hf', 'meta', 'timm'])
def test_each_layout_reproduces_hf_at_its_size(oracle, files, fmt):
    model = load(files[fmt])
    x = torch.randn(2, 3, IMG, IMG)
    want = hf_neck_output(oracle, x)
    with torch.no_grad():
        (got, ) = model(x)
    assert got.shape == want.shape == (2, 32, IMG // 16, IMG // 16)
    assert max_rel_err(got, want) < 1e-5


@pytest.mark.parametrize('size', [(96, 160), (208, 144), (384, 320)])
def test_other_sizes_match_hf_with_vitdet_pos_resize(oracle, files, size):
    """Non-square sizes and one far from the 8 x 8 pretraining grid (24 x 20)."""
    model = load(files['hf'])
    x = torch.randn(1, 3, *size)
    want = hf_neck_output(hf_at_size(oracle, size), x)
    with torch.no_grad():
        (got, ) = model(x)
    assert got.shape == want.shape == (1, 32, size[0] // 16, size[1] // 16)
    assert max_rel_err(got, want) < 1e-5


def test_whole_hf_sam_model_snapshot_loads_its_vision_encoder(tmp_path):
    cfg = transformers.SamConfig(vision_config=SMALL)
    sam = randomise(transformers.SamModel(cfg))
    sam.save_pretrained(str(tmp_path))  # config.json + model.safetensors, as the hub ships
    model = load(str(tmp_path))
    x = torch.randn(1, 3, IMG, IMG)
    with torch.no_grad():
        want = sam.vision_encoder(x).last_hidden_state
        (got, ) = model(x)
    assert max_rel_err(got, want) < 1e-5


def test_without_neck_the_trunk_map_is_returned_and_the_neck_dropped(oracle, files):
    model = load(files['meta'], neck=None)
    assert getattr(model, 'neck', None) is None
    x = torch.randn(1, 3, IMG, IMG)
    with torch.no_grad():
        (trunk, ) = model(x)
        # the oracle's last block output, before its neck
        hidden = oracle(x, output_hidden_states=True).hidden_states[-1]
    assert trunk.shape == (1, 64, IMG // 16, IMG // 16)
    assert max_rel_err(trunk, hidden.permute(0, 3, 1, 2)) < 1e-5


def test_odd_sizes_pad_and_crop_like_the_patch_embedding(files):
    model = load(files['hf'])
    with torch.no_grad():
        (out, ) = model(torch.randn(1, 3, 100, 75))
    assert out.shape == (1, 32, 7, 5)  # ceil(100 / 16), ceil(75 / 16)
    assert torch.isfinite(out).all()


def test_simple_pyramid_on_sam_trunk_loads_sam_weights(files):
    model = ViTAdapter(**ours_kwargs(neck=None, adapter='simple',
                                     adapter_cfg=dict(out_channels=16),
                                     init_cfg=dict(type='Pretrained',
                                                   checkpoint=files['meta'])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model.init_weights()
    # only the new pyramid is reported as initialised; no SAM key is left over
    text = ' '.join(str(w.message) for w in caught)
    assert 'unused' not in text and 'neck' not in text
    outs = model.eval()(torch.randn(1, 3, 90, 130))
    assert [tuple(o.shape[-2:]) for o in outs] == [(23, 33), (12, 17), (6, 9), (3, 5)]


@pytest.mark.slow
@pytest.mark.timeout(900)  # two ViT-B forwards at 1024 x 1024: ~3 min on 2 loaded cores
def test_released_size_sam_b_preset_reproduces_hf(tmp_path):
    """SAM-B at its released size (HF's SamVisionConfig defaults are SAM-B's) through the
    'sam-b' preset and a whole-SAM Meta file, at its only size (1024)."""
    hf = randomise(transformers.SamVisionModel(transformers.SamVisionConfig()))
    path = str(tmp_path / 'sam_vit_b.pth')
    torch.save(to_meta(hf.state_dict()), path)
    model = ViTAdapter(arch='sam-b', neck='sam',
                       init_cfg=dict(type='Pretrained', checkpoint=path))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        model.init_weights()
    x = torch.randn(1, 3, 1024, 1024)
    want = hf_neck_output(hf, x)
    with torch.no_grad():
        (got, ) = model.eval()(x)
    assert got.shape == want.shape == (1, 256, 64, 64)
    assert max_rel_err(got, want) < 1e-5


# -------------------------------------------------------------------------- mismatches
@pytest.mark.parametrize('overrides, field', [
    (dict(window_size=4), 'window_size'),
    (dict(global_attn_indexes=(0, 3)), 'global_attn_indexes'),
    (dict(num_layers=3, global_attn_indexes=(1, )), 'num_layers'),
    (dict(embed_dims=32, num_heads=2), 'embed_dims'),
    (dict(num_heads=8), 'num_heads'),
])
def test_architecture_mismatch_is_a_named_error(files, overrides, field):
    model = ViTAdapter(**ours_kwargs(init_cfg=dict(type='Pretrained',
                                                   checkpoint=files['meta']), **overrides))
    with pytest.raises(CheckpointError, match=field):
        model.init_weights()


def test_rel_pos_tables_into_a_model_without_them_is_an_error(files):
    model = ViTAdapter(**ours_kwargs(use_rel_pos=False,
                                     init_cfg=dict(type='Pretrained', checkpoint=files['timm'])))
    with pytest.raises(CheckpointError, match='use_rel_pos=True'):
        model.init_weights()


def test_config_json_is_checked_too(oracle, tmp_path):
    # keys cannot tell the heads apart when the tables are not there: config.json does
    enc = hf_vision(use_rel_pos=False)
    enc.config.save_pretrained(str(tmp_path))
    safetensors_torch.save_file({k: v.contiguous() for k, v in enc.state_dict().items()},
                                str(tmp_path / 'model.safetensors'))
    model = ViTAdapter(**ours_kwargs(use_rel_pos=False, num_heads=8,
                                     init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path))))
    with pytest.raises(CheckpointError, match='config.json.*num_heads=4'):
        model.init_weights()


def test_neck_width_mismatch_is_refused(files):
    model = ViTAdapter(**ours_kwargs(neck_cfg=dict(out_channels=16),
                                     init_cfg=dict(type='Pretrained', checkpoint=files['hf'])))
    with pytest.raises(CheckpointError, match='neck'):
        model.init_weights()


# ----------------------------------------------------------------------- presets, args
@pytest.mark.parametrize('arch, dims, depth, heads, global_idx', [
    ('sam-b', 768, 12, 12, (2, 5, 8, 11)),
    ('sam-l', 1024, 24, 16, (5, 11, 17, 23)),
    ('sam-h', 1280, 32, 16, (7, 15, 23, 31)),
])
def test_presets_are_the_released_encoders(arch, dims, depth, heads, global_idx):
    from mmvitswin.core.backbones.vit import ARCH_ZOO, preset_defaults
    preset, extra = ARCH_ZOO[arch], preset_defaults(arch)
    assert (preset['embed_dims'], preset['num_layers'], preset['num_heads'],
            preset['feedforward_channels']) == (dims, depth, heads, 4 * dims)
    assert (preset['patch_size'], preset['img_size'], preset['final_norm']) == (16, 1024, False)
    assert extra == dict(with_cls_token=False, window_size=14, global_attn_indexes=global_idx,
                         use_rel_pos=True, norm_cfg=dict(type='LN', eps=1e-6))
    if arch == 'sam-b':  # the built model takes them (B only: L/H are large to build)
        model = ViTAdapter(arch=arch, neck='sam')
        assert (model.embed_dims, model.num_layers, model.num_heads) == (dims, depth, heads)
        assert model.window_size == 14 and tuple(model.global_attn_indexes) == global_idx
        assert model.img_size == (1024, 1024) and model.use_rel_pos
        assert not model.with_cls_token and model.norm is None and model.norm_eps == 1e-6
        assert model.blocks[0].attn.rel_pos_h.shape == (27, 64)
        assert model.blocks[2].attn.rel_pos_h.shape == (127, 64)
        assert model.neck.out_channels == 256


def test_neck_arguments_are_checked():
    with pytest.raises(ValueError, match='neck'):
        ViTAdapter(**ours_kwargs(neck='fpn'))
    with pytest.raises(ValueError, match='neck'):
        ViTAdapter(**ours_kwargs(adapter='simple'))  # the neck replaces a pyramid
    with pytest.raises(ValueError, match='neck_cfg'):
        ViTAdapter(**ours_kwargs(neck_cfg=dict(channels=8)))


# -------------------------------------------------------------------- AMP / compile / ONNX
def small(**overrides) -> ViTAdapter:
    torch.manual_seed(0)
    return ViTAdapter(**ours_kwargs(img_size=64, drop_path_rate=0.1, **overrides))


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_amp_is_finite_and_close_to_fp32(dtype):
    from mmvitswin.core.compat import CPU_AUTOCAST_FP16
    if dtype == torch.float16 and not CPU_AUTOCAST_FP16:
        pytest.skip('fp16 autocast on CPU needs a newer torch')
    model = small().eval()
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
    from mmengine.config import Config
    return Config.fromfile(osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), rel))


@pytest.mark.parametrize('rel, scope, lr, wd, decay', [
    ('configs/mask_rcnn_vitdet_sam_b_coco.py', 'mmdet', 1e-4, 0.1, 0.7),
    ('configs/upernet_vitdet_sam_b_ade20k.py', 'mmseg', 1e-4, 0.05, 0.65),
])
def test_sam_configs_carry_the_vitdet_recipe(rel, scope, lr, wd, decay):
    """The published recipes (ViTDet-B for Mask R-CNN, mmseg's ViT-B UPerNet): layer-wise
    decay over 12 blocks, SAM-B's own window layout, the released file. (Every config also
    builds and predicts in tests/test_configs.py.)"""
    cfg = _config(rel)
    assert cfg.default_scope == scope
    bb = cfg.model.backbone
    assert (bb.type, bb.arch, bb.adapter, bb.get('neck')) == ('ViTAdapter', 'sam-b', 'simple',
                                                              None)
    assert 'window_size' not in bb and 'global_attn_indexes' not in bb  # the preset's: SAM's
    assert bb.drop_path_rate == 0.1
    assert bb.init_cfg.checkpoint.endswith('sam_vit_b_01ec64.pth')
    opt = cfg.optim_wrapper
    assert opt.constructor == 'LayerDecayOptimWrapperConstructor'
    assert (opt.optimizer.type, opt.optimizer.lr, opt.optimizer.weight_decay) == ('AdamW', lr, wd)
    assert (opt.paramwise_cfg.num_layers, opt.paramwise_cfg.layer_decay_rate) == (12, decay)
    if scope == 'mmdet':
        assert cfg.model.neck.in_channels == [256] * 4 and cfg.train_cfg.max_epochs == 36
    else:
        assert cfg.model.decode_head.in_channels == [256] * 4
        assert cfg.model.auxiliary_head.in_channels == 256 and cfg.train_cfg.max_iters == 160000

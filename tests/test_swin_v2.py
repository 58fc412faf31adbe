"""SwinTransformerV2 against HuggingFace ``transformers`` as the oracle.

HF's ``Swinv2Backbone`` with random weights (perturbed away from its init, so that biases,
norms and logit scales all matter) is saved in every released layout -- HF itself (as a
snapshot directory: ``config.json`` + ``model.safetensors``; ``Swinv2Model`` and
``Swinv2ForImageClassification`` state dicts), Microsoft's, timm's and mmpretrain's (renamed
here, test-side, from HF's keys) -- and loaded through ``init_cfg``/``load_pretrained``.

Where the semantics agree: HF pads every stage to a multiple of the window **before** the
cyclic shift, as we do, and it shrinks a window (dropping the shift) only where the stage's map
at ``config.image_size`` is not larger than the window. The oracles are built with a large
``image_size`` so that this never happens: then HF runs full, shifted windows on zero-padded
maps at any input size, exactly our (detection) semantics. HF's ``Swinv2Backbone`` returns the
stage outputs before any norm, ours after ``norm{i}``: parity compares the raw stage maps (what
our forward hands to ``norm{i}``, taken by a hook) with HF's, since a LayerNorm would hide a
per-token scale or shift of a stage's output; our outputs are then checked to be ``norm{i}`` of
HF's maps, which covers the output norms. HF adds the -100 shift mask twice (-200 in all),
Microsoft and we once: with the oracles' logit scales (5-20) a masked logit is at least 44 below
every unmasked one either way (a weight below 1e-19), so both give the same fp32 result.
"""
import copy
import json
import math
import os
import re

import pytest
import torch

from mmvitswin.core.backbones.swin_v2 import SwinTransformerV2
from mmvitswin.core.checkpoint import CheckpointError, load_pretrained
from mmvitswin.core.layers import (CosineWindowAttention, log_spaced_relative_coords,
                                   pretrained_window_of, window_plan)
from conftest import max_rel_err, norm_inputs
from zoo import create_model, example_input, perturb_like_trained

transformers = pytest.importorskip('transformers')
Swinv2Backbone, Swinv2Config = transformers.Swinv2Backbone, transformers.Swinv2Config

NARROW = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
# non-square, not multiples of 32, and one that pads every stage to a single window
SIZES = [(64, 96), (45, 77), (37, 53), (20, 20)]
STAGES = ['stage1', 'stage2', 'stage3', 'stage4']


def hf_config(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window=4,
              pretrained=(0, 0, 0, 0), image_size=1024) -> Swinv2Config:
    """A Swinv2Config whose windows are never shrunk (see the module docstring)."""
    return Swinv2Config(image_size=image_size, embed_dim=embed_dims, depths=list(depths),
                        num_heads=list(num_heads), window_size=window,
                        pretrained_window_sizes=list(pretrained), drop_path_rate=0.0,
                        out_features=STAGES)


def perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter moved off its init (zoo.perturb_like_trained), in eval mode."""
    return perturb_like_trained(model, seed).eval()


@pytest.fixture(scope='module')
def hf_narrow():
    torch.manual_seed(0)
    return perturbed(Swinv2Backbone(hf_config()))


def hf_with(hf, window, pretrained, **dims):
    """HF's backbone with ``hf``'s weights (``dims``: its width, depths and heads, if not
    the narrow model's) at another window and pretrained windows."""
    other = Swinv2Backbone(hf_config(**dims, window=window, pretrained=pretrained)).eval()
    missing, unexpected = other.load_state_dict(hf.state_dict(), strict=False)
    assert not missing and not unexpected
    return other


def hf_maps(hf, x) -> list:
    """HF's raw stage maps (NCHW; its backbone has no output norms)."""
    with torch.no_grad():
        return list(hf(x).feature_maps)


def our_stage_maps(model, x):
    """``(raw, outs)``: the stage maps our forward hands to ``norm{i}`` (NCHW) and the
    forward's own outputs, from one no-grad call."""
    raw, outs = norm_inputs(model, x, model.out_indices)
    return [r.permute(0, 3, 1, 2) for r in raw], outs


def with_our_norm(model, i, nchw):
    """Our ``norm{i}`` applied to an NCHW map (over its channels)."""
    with torch.no_grad():
        return getattr(model, f'norm{i}')(nchw.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def assert_matches_hf(model, hf, sizes=SIZES, tol=1e-5):
    """At each size: our raw stage maps against HF's (the parity), and our outputs against our
    ``norm{i}`` of HF's maps (the output norms)."""
    model.eval()
    for size in sizes:
        x = torch.randn(2, 3, *size)
        raw, got = our_stage_maps(model, x)
        want = hf_maps(hf, x)
        assert len(raw) == len(got) == len(want) == 4
        for i, (r, a, b) in enumerate(zip(raw, got, want)):
            assert r.shape == a.shape == b.shape, (size, i)
            err = max_rel_err(r, b)
            assert err < tol, f'{size} stage {i}: relative error {err:.2e} before norm{i}'
            err = max_rel_err(a, with_our_norm(model, i, b))
            assert err < tol, f'{size} stage {i}: relative error {err:.2e} after norm{i}'


# --------------------------------------------------------------- test-side layout writers
# Written from HF's module structure, not from our converter: HF's merging concatenates the
# 2x2 neighbours (0,0), (1,0), (0,1), (1,1) (Microsoft's and timm's order); mmpretrain's (and
# ours) is nn.Unfold's channel-major [c, dy, dx].
def _unfold_columns(weight: torch.Tensor) -> torch.Tensor:
    c = weight.shape[1] // 4
    order = [(dy + 2 * dx) * c + ch for ch in range(c) for dy in range(2) for dx in range(2)]
    return weight[:, order]


def _hf_blocks(hf):
    for s, stage in enumerate(hf.encoder.layers):
        for b, block in enumerate(stage.blocks):
            yield s, b, block


def hf_to_microsoft_layout(hf, with_tables: bool = True) -> dict:
    """Microsoft's release layout, with the derived buffers its files carry."""
    sd = {'patch_embed.proj.weight': hf.embeddings.patch_embeddings.projection.weight,
          'patch_embed.proj.bias': hf.embeddings.patch_embeddings.projection.bias,
          'patch_embed.norm.weight': hf.embeddings.norm.weight,
          'patch_embed.norm.bias': hf.embeddings.norm.bias}
    for s, b, blk in _hf_blocks(hf):
        p, att = f'layers.{s}.blocks.{b}.', blk.attention.self
        sd[p + 'attn.qkv.weight'] = torch.cat([att.query.weight, att.key.weight,
                                               att.value.weight])
        sd[p + 'attn.q_bias'], sd[p + 'attn.v_bias'] = att.query.bias, att.value.bias
        sd[p + 'attn.logit_scale'] = att.logit_scale
        for i in (0, 2):
            for n, t in att.continuous_position_bias_mlp[i].named_parameters():
                sd[p + f'attn.cpb_mlp.{i}.{n}'] = t
        if with_tables:
            sd[p + 'attn.relative_coords_table'] = att.relative_coords_table
            sd[p + 'attn.relative_position_index'] = att.relative_position_index
        sd[p + 'attn.proj.weight'] = blk.attention.output.dense.weight
        sd[p + 'attn.proj.bias'] = blk.attention.output.dense.bias
        for ours, theirs in (('norm1', blk.layernorm_before), ('norm2', blk.layernorm_after),
                             ('mlp.fc1', blk.intermediate.dense), ('mlp.fc2', blk.output.dense)):
            sd[p + ours + '.weight'], sd[p + ours + '.bias'] = theirs.weight, theirs.bias
    for s, stage in enumerate(hf.encoder.layers):
        if stage.downsample is not None:
            sd[f'layers.{s}.downsample.reduction.weight'] = stage.downsample.reduction.weight
            sd[f'layers.{s}.downsample.norm.weight'] = stage.downsample.norm.weight
            sd[f'layers.{s}.downsample.norm.bias'] = stage.downsample.norm.bias
    width = hf.num_features[-1]  # the classifier's final norm and head: unused
    sd['norm.weight'], sd['head.weight'] = torch.ones(width), torch.zeros(10, width)
    return {k: v.detach().clone() for k, v in sd.items()}


def _shift_downsample(sd: dict, stage_key: str) -> dict:
    out = {}
    for k, v in sd.items():
        parts = k.split('.')
        if parts[0] == stage_key and parts[2] == 'downsample':
            parts[1] = str(int(parts[1]) + 1)
        out['.'.join(parts)] = v
    return out


def hf_to_timm_layout(hf) -> dict:
    """timm's swinv2_*: Microsoft's names, downsample at the start of the next stage, no
    derived buffers (non-persistent), a zero ``k_bias``."""
    sd = _shift_downsample(hf_to_microsoft_layout(hf, with_tables=False), 'layers')
    for k in [k for k in sd if k.endswith('attn.q_bias')]:
        sd[k.replace('q_bias', 'k_bias')] = torch.zeros_like(sd[k])
    return sd


def hf_to_mmpretrain_layout(hf) -> dict:
    """mmpretrain's SwinTransformerV2: stages / w_msa / ffn names, downsample at the start of
    the next stage, nn.Unfold merging order, derived buffers saved."""
    out = {}
    for k, v in hf_to_microsoft_layout(hf).items():
        if k.startswith(('norm.', 'head.')):
            continue
        k = (k.replace('patch_embed.proj.', 'patch_embed.projection.')
             .replace('.attn.', '.attn.w_msa.').replace('.mlp.fc1.', '.ffn.layers.0.0.')
             .replace('.mlp.fc2.', '.ffn.layers.1.').replace('layers.', 'stages.', 1))
        if k.endswith('downsample.reduction.weight'):
            v = _unfold_columns(v)
        out[k] = v
    return _shift_downsample(out, 'stages')


def hf_model_layout(hf) -> dict:
    """``Swinv2Model``'s state dict: the backbone's plus the final ``layernorm``."""
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    width = hf.num_features[-1]
    sd['layernorm.weight'], sd['layernorm.bias'] = torch.ones(width), torch.zeros(width)
    return sd


def hf_classifier_layout(hf) -> dict:
    """``Swinv2ForImageClassification``'s: the model under ``swinv2.`` plus a classifier."""
    sd = {'swinv2.' + k: v for k, v in hf_model_layout(hf).items()}
    width = hf.num_features[-1]
    sd['classifier.weight'], sd['classifier.bias'] = torch.zeros(10, width), torch.zeros(10)
    return sd


LAYOUTS = {'microsoft': hf_to_microsoft_layout, 'timm': hf_to_timm_layout,
           'mmpretrain': hf_to_mmpretrain_layout, 'hf-model': hf_model_layout,
           'hf-classifier': hf_classifier_layout}


def save_hf_snapshot(hf, path) -> str:
    """What the hub ships: config.json + model.safetensors."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    hf.config.save_pretrained(path)
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()},
              os.path.join(path, 'model.safetensors'))
    return str(path)


def save_timm_snapshot(hf, path, config: dict) -> str:
    """A timm hub snapshot: ``hf``'s weights in timm's layout as model.safetensors, beside
    ``config`` as config.json."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    save_file({k: v.contiguous() for k, v in hf_to_timm_layout(hf).items()},
              os.path.join(path, 'model.safetensors'))
    with open(os.path.join(path, 'config.json'), 'w') as f:
        json.dump(config, f)
    return str(path)


def load(model, path):
    with pytest.warns(UserWarning):  # the final norm/head or the output norms are reported
        return load_pretrained(model, str(path))


# ----------------------------------------------------------------------------- parity
@pytest.mark.parametrize('layout', sorted(LAYOUTS))
def test_every_layout_reproduces_hf(hf_narrow, layout, tmp_path):
    path = tmp_path / f'{layout}.pth'
    torch.save(LAYOUTS[layout](hf_narrow), path)
    model = SwinTransformerV2(**NARROW, window_size=4)
    load(model, path)
    assert_matches_hf(model, hf_narrow)


def test_hf_snapshot_directory_and_safetensors_reproduce_hf(hf_narrow, tmp_path):
    snapshot = save_hf_snapshot(hf_narrow, tmp_path / 'snapshot')
    model = SwinTransformerV2(**NARROW, window_size=4, init_cfg=dict(type='Pretrained',
                                                                       checkpoint=snapshot))
    with pytest.warns(UserWarning, match='norm0'):  # HF's backbone has no output norms
        model.init_weights()
    assert_matches_hf(model, hf_narrow)
    # timm ships safetensors too
    from safetensors.torch import save_file
    timm_file = str(tmp_path / 'timm.safetensors')
    save_file({k: v.contiguous() for k, v in hf_to_timm_layout(hf_narrow).items()}, timm_file)
    model = SwinTransformerV2(**NARROW, window_size=4)
    load(model, timm_file)
    assert_matches_hf(model, hf_narrow, sizes=SIZES[:1])


def test_window_transfer_matches_hf_with_the_same_config_change(hf_narrow, tmp_path):
    """A window-4 checkpoint run at window 8 with pretrained_window_sizes=4, against HF's model
    with the same weights and the same config change (no table is resampled: the MLP's input
    coordinates keep their scale)."""
    hf8 = hf_with(hf_narrow, 8, (4, 4, 4, 4))
    path = tmp_path / 'window4_microsoft.pth'
    torch.save(hf_to_microsoft_layout(hf_narrow), path)  # its coordinate tables: window 4
    model = SwinTransformerV2(**NARROW, window_size=8, pretrained_window_sizes=4)
    load(model, path)
    assert_matches_hf(model, hf8, sizes=[(64, 96), (45, 77), (70, 41)])
    # and the transfer is not a no-op: window 8 differs from window 4
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        assert max_rel_err(hf8(x).feature_maps[0], hf_narrow(x).feature_maps[0]) > 1e-2


TINY = dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))  # SwinV2-T
# non-square, none a multiple of 32
TINY_SIZES = [(96, 160), (77, 45), (130, 98)]
# the layouts SwinV2-T is released in: HF's hub files (Swinv2ForImageClassification),
# Microsoft's and timm's
TINY_LAYOUTS = ['hf-classifier', 'microsoft', 'timm']


@pytest.fixture(scope='module')
def hf_tiny():
    """A SwinV2-T HF backbone at window 8 (the window8_256 releases), random weights."""
    torch.manual_seed(0)
    return perturbed(Swinv2Backbone(hf_config(**TINY, window=8)))


@pytest.mark.slow
@pytest.mark.parametrize('layout', TINY_LAYOUTS)
def test_swinv2_tiny_sized_model_reproduces_hf(hf_tiny, layout, tmp_path):
    """SwinV2-T (arch='tiny') from each released layout of HF's weights, at three odd sizes."""
    path = tmp_path / f'swinv2_t_{layout}.pth'
    torch.save(LAYOUTS[layout](hf_tiny), path)
    model = SwinTransformerV2(arch='tiny', window_size=8, drop_path_rate=0.)
    load(model, path)
    assert_matches_hf(model, hf_tiny, sizes=TINY_SIZES)


@pytest.mark.slow
def test_swinv2_tiny_window_8_weights_run_at_window_16_match_hf(hf_tiny, tmp_path):
    """A window-8 SwinV2-T file (Microsoft's layout, its coordinate tables normalised to 8) run
    at window 16 with pretrained_window_sizes=8, against HF's SwinV2-T with the same weights
    and the same config change; the window-16 maps are not the window-8 ones."""
    hf16 = hf_with(hf_tiny, 16, (8, 8, 8, 8), **TINY)
    path = tmp_path / 'swinv2_t_window8_microsoft.pth'
    torch.save(hf_to_microsoft_layout(hf_tiny), path)
    model = SwinTransformerV2(arch='tiny', window_size=16, pretrained_window_sizes=8,
                              drop_path_rate=0.)
    load(model, path)
    assert_matches_hf(model, hf16, sizes=TINY_SIZES)
    x = torch.randn(1, 3, *TINY_SIZES[2])
    for i, (at16, at8) in enumerate(zip(hf_maps(hf16, x), hf_maps(hf_tiny, x))):
        assert max_rel_err(at16, at8) > 1e-2, f'stage {i}: window 16 gives window 8\'s map'


# ------------------------------------------------------------------------------ errors
def test_coordinate_tables_of_another_window_are_refused(hf_narrow, tmp_path):
    path = tmp_path / 'window4.pth'
    torch.save(hf_to_microsoft_layout(hf_narrow), path)
    model = SwinTransformerV2(**NARROW, window_size=8)  # would normalise to 8, file: to 4
    with pytest.raises(CheckpointError, match=r'pretrained_window_sizes\[0\]=4'):
        load_pretrained(model, str(path))


def test_config_json_of_another_pretrained_window_is_refused(hf_narrow, tmp_path):
    snapshot = save_hf_snapshot(hf_narrow, tmp_path / 'snapshot')
    model = SwinTransformerV2(**NARROW, window_size=8)
    with pytest.raises(CheckpointError, match='pretrained_window_sizes'):
        load_pretrained(model, snapshot)


@pytest.mark.parametrize('change, field', [
    (dict(depths=(2, 2, 4, 2)), 'depths'),
    (dict(num_heads=(1, 2, 2, 8)), 'num_heads'),
    (dict(embed_dims=32, num_heads=(1, 2, 4, 8)), 'embed_dims'),
])
def test_architecture_mismatch_is_a_named_error(hf_narrow, tmp_path, change, field):
    path = tmp_path / 'timm.pth'
    torch.save(hf_to_timm_layout(hf_narrow), path)
    model = SwinTransformerV2(**dict(NARROW, **change), window_size=4)
    with pytest.raises(CheckpointError, match=field):
        load_pretrained(model, str(path))


def test_swin_v1_file_and_key_bias_are_refused(hf_narrow, tmp_path):
    from mmvitswin.core.backbones.swin import SwinTransformer
    v1 = tmp_path / 'v1.pth'
    torch.save(SwinTransformer(**NARROW, window_size=4).state_dict(), v1)
    with pytest.raises(CheckpointError, match='Swin V1'):
        load_pretrained(SwinTransformerV2(**NARROW, window_size=4), str(v1))
    sd = dict(hf_narrow.state_dict())
    key = next(k for k in sd if k.endswith('key.weight'))
    sd[key.replace('weight', 'bias')] = torch.ones(sd[key].shape[0])
    path = tmp_path / 'kbias.pth'
    torch.save(sd, path)
    with pytest.raises(CheckpointError, match='key bias'):
        load_pretrained(SwinTransformerV2(**NARROW, window_size=4), str(path))


@pytest.mark.parametrize('without, match', [
    (dict(qkv_bias=False), 'qkv_bias=True'), (dict(patch_norm=False), 'patch_norm=True')])
def test_features_the_model_lacks_are_refused(hf_narrow, tmp_path, without, match):
    """A file with q/v biases or a patch-embedding norm, into a model built without them: an
    error naming the setting, not a warning about unused keys and features without them."""
    path = tmp_path / 'microsoft.pth'
    torch.save(hf_to_microsoft_layout(hf_narrow), path)
    with pytest.raises(CheckpointError, match=match):
        load_pretrained(SwinTransformerV2(**NARROW, window_size=4, **without), str(path))


def test_a_file_without_patch_norm_needs_a_model_without_it(hf_narrow, tmp_path):
    """Initialised, the model's patch-embedding norm would give other features than the
    file's weights were trained with: refused, naming the setting; built without it, loads."""
    sd = {k: v for k, v in hf_to_microsoft_layout(hf_narrow).items()
          if not k.startswith('patch_embed.norm.')}
    path = tmp_path / 'no_patch_norm.pth'
    torch.save(sd, path)
    with pytest.raises(CheckpointError, match='patch_norm=False, but this model has '
                       'patch_norm=True'):
        load_pretrained(SwinTransformerV2(**NARROW, window_size=4), str(path))
    load(SwinTransformerV2(**NARROW, window_size=4, patch_norm=False), path)


def test_v2_files_are_refused_by_v1_and_timm_cr_files_by_v2(hf_narrow, tmp_path):
    """Swin V1 would rename a V2 file's blocks to its own and load them as what they are not;
    timm's swinv2_cr_* (a meta-MLP position bias and a temperature ``tau`` instead of the
    release's logit scale) is another architecture."""
    from mmvitswin.core.backbones.swin import SwinTransformer
    path = tmp_path / 'microsoft.pth'
    torch.save(hf_to_microsoft_layout(hf_narrow), path)
    with pytest.raises(CheckpointError, match='SwinTransformerV2'):
        load_pretrained(SwinTransformer(**NARROW, window_size=4), str(path))
    cr = {'patch_embed.proj.weight': torch.zeros(16, 3, 4, 4),
          'stages.0.blocks.0.attn.qkv.weight': torch.zeros(48, 16),
          'stages.0.blocks.0.attn.meta_mlp.fc1.weight': torch.zeros(384, 2),
          'stages.0.blocks.0.attn.tau': torch.ones(1), 'stages.0.blocks.0.norm1.weight':
          torch.ones(16)}
    torch.save(cr, tmp_path / 'cr.pth')
    with pytest.raises(CheckpointError, match='swinv2_cr'):
        load_pretrained(SwinTransformerV2(**NARROW, window_size=4), str(tmp_path / 'cr.pth'))


@pytest.mark.parametrize('name, windows', [
    ('swinv2_tiny_window8_256', (8, 8, 8, 8)),
    ('swinv2_small_window16_256', (16, 16, 16, 8)),  # its 8x8 last stage ran at window 8
    ('swinv2_base_window12_192', (12, 12, 12, 6)),
    ('swinv2_base_window12to16_192to256', (12, 12, 12, 6)),
    ('swinv2_large_window12to24_192to384', (12, 12, 12, 6)),
    ('swinv2_base_window12to16_192to256_22kft1k', (12, 12, 12, 6)),  # timm < 0.9's name
])
def test_timm_snapshot_config_states_the_trained_windows(hf_narrow, tmp_path, name, windows):
    """timm's hub snapshot: model.safetensors beside a config.json whose ``architecture`` is
    the registered model (a 'to' model was trained at the first window and size). The model
    must normalise its bias coordinates to those windows; ``model_args`` override the name."""
    from mmvitswin.core.checkpoint.swin_v2 import swinv2_config_arch
    config = {'architecture': name, 'num_classes': 1000,
              'pretrained_cfg': {'tag': 'ms_in1k', 'input_size': [3, 256, 256]}}
    snapshot = tmp_path / 'snapshot'
    save_timm_snapshot(hf_narrow, snapshot, config)
    assert swinv2_config_arch(config) == dict(pretrained_window_sizes=windows)
    window = 24 if name.endswith('384') else 16
    with pytest.raises(CheckpointError, match=re.escape(f'pretrained_window_sizes={windows}')):
        load_pretrained(SwinTransformerV2(**NARROW, window_size=window), str(snapshot))
    model = SwinTransformerV2(**NARROW, window_size=window, pretrained_window_sizes=windows)
    load(model, str(snapshot / 'model.safetensors'))  # the config.json beside it is read
    assert_matches_hf(model, hf_with(hf_narrow, window, windows), sizes=SIZES[:1])
    # model_args (what timm.create_model was given) win over the name's values
    config['model_args'] = {'window_size': 16, 'img_size': 512, 'pretrained_window_sizes': 0}
    assert swinv2_config_arch(config) == dict(pretrained_window_sizes=(16, 16, 16, 16))
    for other in ('swin_tiny_patch4_window7_224', 'swinv2_cr_tiny_ns_224'):
        assert swinv2_config_arch({'architecture': other}) == {}


@pytest.mark.slow
def test_convert_tool_keeps_a_v2_files_windows(hf_narrow, tmp_path, capsys):
    """tools/convert_checkpoint.py without --backbone: a Swin V2 HF snapshot is renamed to
    SwinTransformerV2's keys (not V1's), with the windows its config.json states written as
    coordinate tables, so that loading the output still refuses a model at other windows."""
    from test_swin_checkpoint import _tool_main
    snapshot = save_hf_snapshot(hf_narrow, tmp_path / 'snapshot')
    out = tmp_path / 'converted.pth'
    assert _tool_main()([snapshot, str(out)]) == 0, capsys.readouterr().err
    assert 'Swin V2, detected format: hf' in capsys.readouterr().out
    with pytest.raises(CheckpointError, match=r'pretrained_window_sizes\[0\]=4'):
        load_pretrained(SwinTransformerV2(**NARROW, window_size=8), str(out))
    model = SwinTransformerV2(**NARROW, window_size=4)
    load(model, out)
    assert_matches_hf(model, hf_narrow, sizes=SIZES[:2])
    # a timm snapshot whose model_args give a non-square window (which our model, square
    # windows only, cannot run): its tables read back as such, a named refusal
    timm_snapshot = save_timm_snapshot(hf_narrow, tmp_path / 'timm_snapshot', {
        'architecture': 'swinv2_tiny_window8_256', 'model_args': {'window_size': [4, 8]}})
    out = tmp_path / 'converted_timm.pth'
    assert _tool_main()([timm_snapshot, str(out)]) == 0, capsys.readouterr().err
    with pytest.raises(CheckpointError, match=re.escape('normalised to window (4, 8)')):
        load_pretrained(SwinTransformerV2(**NARROW, window_size=4), str(out))


def test_derived_buffers_are_rebuilt_not_loaded(hf_narrow, tmp_path):
    sd = hf_to_microsoft_layout(hf_narrow)
    for k in sd:
        if k.endswith('relative_position_index'):
            sd[k] = torch.zeros_like(sd[k])
    path = tmp_path / 'garbage_index.pth'
    torch.save(sd, path)
    model = SwinTransformerV2(**NARROW, window_size=4)
    load(model, path)
    assert all(not k.endswith(('relative_position_index', 'relative_coords_table'))
               for k in model.state_dict())
    assert_matches_hf(model, hf_narrow, sizes=SIZES[:1])


def test_own_state_dict_round_trips_strictly():
    a = perturbed(SwinTransformerV2(**NARROW, window_size=4))
    b = SwinTransformerV2(**NARROW, window_size=4)
    b.load_state_dict(b.convert_checkpoint(a.state_dict()), strict=True)
    x = torch.randn(1, 3, 45, 77)
    with torch.no_grad():
        assert all(torch.equal(p, q) for p, q in zip(a(x), b.eval()(x)))


# ------------------------------------------------------------------------- the layers
def test_log_spaced_coordinates_and_their_inverse():
    coords = log_spaced_relative_coords((4, 4))
    assert coords.shape == (49, 2)
    # offset (1, 0) of a window-4 table normalised to window 4: log2(1 + 8/3) / 3
    assert torch.isclose(coords[4 * 7 + 3, 0], torch.tensor(math.log2(1 + 8 / 3) / 3))
    # the largest offset (p - 1) maps to 8 before the log
    assert torch.isclose(coords.abs().max(), torch.tensor(math.log2(9) / 3))
    assert pretrained_window_of(log_spaced_relative_coords((8, 8), (4, 4)).view(15, 15, 2)) \
        == (4, 4)
    assert pretrained_window_of(log_spaced_relative_coords((6, 6)).view(1, 11, 11, 2)) == (6, 6)


def test_logit_scale_is_clamped_at_log_100():
    torch.manual_seed(0)
    attn = CosineWindowAttention(16, 2, (4, 4)).eval()
    x = torch.randn(3, 4, 4, 16)
    plan = window_plan((4, 4), (4, 4), (0, 0), x.device)
    with torch.no_grad():
        attn.logit_scale.fill_(math.log(100.))
        at_cap = attn(x, plan)
        attn.logit_scale.fill_(9.)  # exp(9) = 8103 without the clamp
        above = attn(x, plan)
        attn.logit_scale.fill_(math.log(50.))
        below = attn(x, plan)
    assert torch.equal(at_cap, above)
    assert not torch.allclose(at_cap, below)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_is_finite_and_close_to_fp32(hf_narrow, dtype, tmp_path):
    """Zero-padded tokens (k = 0 at every padded position of 45x77) would give 0/0 in a fp16
    normalisation; ours normalises in fp32."""
    path = tmp_path / 'hf.pth'
    torch.save(hf_narrow.state_dict(), path)
    model = SwinTransformerV2(**NARROW, window_size=4)
    load(model, path)
    model.eval()
    x = torch.randn(2, 3, 45, 77)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast('cpu', dtype=dtype):
            low = model(x)
    for a, b in zip(low, ref):
        assert torch.isfinite(a).all()
        assert max_rel_err(a.float(), b) < 5e-2
    model.train()
    with torch.autocast('cpu', dtype=dtype):
        loss = sum(o.float().square().mean() for o in model(x))
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_bf16_forward_stays_close_to_fp32_at_every_stage():
    """The position bias enters the attention centred on 0 (``16 sigmoid - 8``, the same
    softmax), so its bf16 rounding is half that of a bias in [0, 16]: with trained-like weights
    (four seeds) every stage of a bf16 autocast forward stays within 3.5e-2 of fp32, which the
    uncentred bias does not."""
    worst = 0.
    for seed in range(4):
        model = create_model('swinv2', seed=seed).eval()
        x = example_input('swinv2')
        with torch.no_grad():
            ref = model(x)
            with torch.autocast('cpu', dtype=torch.bfloat16):
                low = model(x)
        worst = max([worst] + [max_rel_err(a.float(), b) for a, b in zip(low, ref)])
    assert worst < 3.5e-2


@pytest.mark.parametrize('size', [(45, 77), (20, 20)])
def test_gradients_match_hf(hf_narrow, size, tmp_path):
    """The autograd path (q and k normalised in the attention, the bias's gradient through the
    CPB MLP) against HF's on the same weights: the input's gradient and those of the cosine
    attention's own parameters, at sizes that pad and shift."""
    path = tmp_path / 'hf.pth'
    torch.save(hf_model_layout(hf_narrow), path)
    model = SwinTransformerV2(**NARROW, window_size=4, drop_path_rate=0.).eval()
    load(model, path)
    for i in range(4):  # HF's backbone has no output norms: compare raw stage maps
        setattr(model, f'norm{i}', torch.nn.Identity())
    hf = copy.deepcopy(hf_narrow)
    x = torch.randn(2, 3, *size)
    weights = [torch.randn(2, c, 1, 1) for c in (16, 32, 64, 128)]
    grads = []
    for run in (lambda t: model(t), lambda t: hf(t).feature_maps):
        xg = x.clone().requires_grad_()
        sum((m * w).square().mean() for m, w in zip(run(xg), weights)).backward()
        grads.append(xg.grad)
    assert max_rel_err(grads[0], grads[1]) < 1e-5
    ours = dict(model.named_parameters())
    theirs = dict(hf.named_parameters())
    for s, b in ((0, 0), (1, 1), (3, 1)):
        mine = f'stages.{s}.blocks.{b}.attn.w_msa.'
        hf_attn = f'encoder.layers.{s}.blocks.{b}.attention.self.'
        for a, h in (('logit_scale', 'logit_scale'), ('q_bias', 'query.bias'),
                     ('v_bias', 'value.bias'), ('cpb_mlp.0.weight',
                                                'continuous_position_bias_mlp.0.weight'),
                     ('cpb_mlp.2.weight', 'continuous_position_bias_mlp.2.weight')):
            got, want = ours[mine + a].grad, theirs[hf_attn + h].grad
            assert got is not None and want.abs().max() > 0, (s, b, a)
            assert max_rel_err(got.reshape(want.shape), want) < 1e-4, (s, b, a)


def test_gradients_reach_every_parameter_and_with_cp_agrees():
    grads = []
    for with_cp in (False, True):
        torch.manual_seed(0)
        model = SwinTransformerV2(**NARROW, window_size=4, drop_path_rate=0., with_cp=with_cp)
        x = torch.randn(2, 3, 37, 53)
        sum(o.square().mean() for o in model(x)).backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None
                   or not p.grad.abs().sum() > 0]
        assert not missing, missing
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], rtol=1e-4, atol=1e-6), name


# ----------------------------------------------------------------- backbone contract
def test_pyramid_contract_presets_and_freezing():
    model = SwinTransformerV2(**NARROW, window_size=4, out_indices=(1, 3), frozen_stages=2)
    outs = model.train()(torch.randn(1, 3, 61, 83))
    assert [tuple(o.shape) for o in outs] == [(1, 32, 8, 11), (1, 128, 2, 3)]
    assert all(o.is_contiguous() for o in outs)
    assert model.out_strides == (8, 32) and model.out_channels == (32, 128)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert any(n.startswith('stages.1.') for n in frozen)
    assert not any(n.startswith('stages.2.') for n in frozen)
    assert not model.stages[0].training and model.stages[2].training
    assert model.get_layer_depth('patch_embed.projection.weight') == 0
    assert model.get_layer_depth('stages.1.blocks.0.attn.w_msa.logit_scale') == 3
    assert model.get_layer_depth('stages.1.downsample.reduction.weight') == 4
    assert model.get_layer_depth('norm3.weight') == 9
    tiny = SwinTransformerV2(arch='t')
    assert tiny.window_sizes == ((8, 8), ) * 4 and tiny.num_features == [96, 192, 384, 768]
    assert SwinTransformerV2(arch='large').window_sizes[0] == (12, 12)
    per_stage = SwinTransformerV2(**NARROW, window_size=(8, 8, 8, 4),
                                  pretrained_window_sizes=(4, 4, 4, 2))
    assert per_stage.stages[3].blocks[0].attn.w_msa.relative_coords_table.shape == (49, 2)


@pytest.mark.parametrize('kwargs, match', [
    (dict(window_size=(4, 4)), 'window_size'),
    (dict(pretrained_window_sizes=-1), 'pretrained_window_sizes'),
    (dict(pretrained_window_sizes=(4, 4, 4, 1)), 'pretrained_window_sizes'),
    (dict(num_heads=(1, 2, 4)), 'num_heads'),
    (dict(arch='huge'), 'arch'),
])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        SwinTransformerV2(**dict(NARROW, window_size=4, **kwargs))


# ------------------------------------------------------------------------------ configs
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V2_CONFIGS = {  # config -> (arch, detection epochs / segmentation iterations, drop path)
    'mask_rcnn_swinv2_t_coco.py': ('tiny', 12, 0.2),
    'mask_rcnn_swinv2_t_coco_3x.py': ('tiny', 36, 0.2),
    'mask_rcnn_swinv2_s_coco.py': ('small', 12, 0.3),
    'mask_rcnn_swinv2_s_coco_3x.py': ('small', 36, 0.3),
    'mask_rcnn_swinv2_b_coco.py': ('base', 12, 0.3),
    'mask_rcnn_swinv2_b_coco_3x.py': ('base', 36, 0.3),
    'upernet_swinv2_t_ade20k.py': ('tiny', 160000, 0.3),
    'upernet_swinv2_s_ade20k.py': ('small', 160000, 0.3),
    'upernet_swinv2_b_ade20k.py': ('base', 160000, 0.3),
}


@pytest.mark.parametrize('name', sorted(V2_CONFIGS))
def test_config_recipe_values(name):
    """Window 16 from the 256-px window-16 releases, their last stage's bias coordinates at 8,
    the Swin recipes' optimisers and schedules, V2's weight-decay exemptions. (Building and
    predicting: tests/test_configs.py, which covers every config.)"""
    mmengine = pytest.importorskip('mmengine')
    cfg = mmengine.Config.fromfile(os.path.join(ROOT, 'configs', name))
    arch, length, drop_path = V2_CONFIGS[name]
    bb = cfg.model.backbone
    assert (bb.type, bb.arch, bb.window_size, tuple(bb.pretrained_window_sizes)) == (
        'SwinTransformerV2', arch, 16, (16, 16, 16, 8))
    assert bb.drop_path_rate == drop_path and 'qk_scale' not in bb
    assert bb.init_cfg.checkpoint == ('https://github.com/SwinTransformer/storage/releases/'
                                      f'download/v2.0.0/swinv2_{arch}_patch4_window16_256.pth')
    assert cfg.optim_wrapper.constructor == 'GroupedOptimWrapperConstructor'
    assert cfg.optim_wrapper.optimizer.fused == 'auto'
    paramwise = cfg.optim_wrapper.paramwise_cfg
    assert {k: v['decay_mult'] for k, v in paramwise.custom_keys.items()} == {
        'cpb_mlp': 0., 'logit_scale': 0., 'q_bias': 0., 'v_bias': 0.}
    assert paramwise.norm_decay_mult == 0. and paramwise.bias_decay_mult == 0.
    dims = {'tiny': 96, 'small': 96, 'base': 128}[arch]
    opt = cfg.optim_wrapper.optimizer
    if name.startswith('mask_rcnn'):
        assert (opt.type, opt.lr, opt.weight_decay) == ('AdamW', 1e-4, 0.05)
        assert cfg.train_cfg.max_epochs == length
        assert cfg.param_scheduler[-1].milestones == ([8, 11] if length == 12 else [27, 33])
        assert cfg.model.neck.in_channels == [dims * 2**i for i in range(4)]
    else:
        assert (opt.type, opt.lr, opt.weight_decay) == ('AdamW', 6e-5, 0.01)
        assert cfg.train_cfg.max_iters == length
        assert cfg.model.decode_head.in_channels == [dims * 2**i for i in range(4)]
        assert cfg.model.auxiliary_head.in_channels == dims * 4


def test_config_optimizer_gives_mmengines_settings_fused():
    """The configs' optimizer (GroupedOptimWrapperConstructor, fused='auto') on a small Swin V2:
    every parameter gets the lr and weight decay mmengine's default constructor gives it for
    the same paramwise_cfg (the oracle; decay 0 for the bias MLP, logit scales, q/v biases and
    norms), in a few groups, with torch's fused AdamW where this torch has one on the CPU."""
    mmengine = pytest.importorskip('mmengine')
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    import mmvitswin  # noqa: F401  (registers the constructor)
    from test_grouped_optim import fused_adamw_on_cpu
    cfg = mmengine.Config.fromfile(os.path.join(ROOT, 'configs', 'mask_rcnn_swinv2_t_coco.py'))
    model = torch.nn.Module()
    model.backbone = SwinTransformerV2(embed_dims=16, depths=(2, 2), num_heads=(1, 2),
                                       strides=(4, 2), window_size=4,
                                       out_indices=(0, 1))
    ref_cfg = copy.deepcopy(cfg.optim_wrapper.to_dict())
    del ref_cfg['constructor'], ref_cfg['optimizer']['fused']
    with DefaultScope.overwrite_default_scope(cfg.default_scope):  # as the Runner builds it
        ours = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper.to_dict())).optimizer
        ref = build_optim_wrapper(model, ref_cfg).optimizer
    names = {id(p): n for n, p in model.named_parameters()}

    def settings(opt):
        return {names[id(p)]: (g['lr'], g['weight_decay']) for g in opt.param_groups
                for p in g['params']}
    expected = settings(ref)
    assert settings(ours) == expected and len(expected) == len(names)
    assert expected['backbone.stages.0.blocks.0.attn.w_msa.logit_scale'][1] == 0.
    assert expected['backbone.stages.0.blocks.0.attn.w_msa.qkv.weight'][1] == 0.05
    distinct = {tuple(sorted((k, repr(v)) for k, v in g.items() if k != 'params'))
                for g in ref.param_groups}  # mmengine: one group per tensor
    assert len(ours.param_groups) == len(distinct) < len(ref.param_groups) == len(names)
    assert all(bool(g.get('fused')) == fused_adamw_on_cpu() for g in ours.param_groups)


@pytest.mark.slow(
    reason='two training steps of Swin V2 Mask R-CNN and UPerNet configs (T, S, B), fp32 and bf16')
@pytest.mark.parametrize('precision', ['fp32', 'bf16'])
@pytest.mark.parametrize('name', ['mask_rcnn_swinv2_t_coco.py', 'upernet_swinv2_t_ade20k.py',
                                  'mask_rcnn_swinv2_b_coco.py', 'upernet_swinv2_s_ade20k.py'])
def test_config_trains_two_steps(name, precision):
    """A Swin V2 config's model (one block per stage, the trunk's widths kept; the necks and heads
    narrowed, as ``build_to_train`` does) takes two optimisation steps through the config's own
    optimizer (the grouped constructor, fused AdamW where torch has it) and, for bf16, the CPU
    AMP wrapper ``tools/train.py --amp`` selects, on odd-size images: finite losses, and the
    V2-only parameters (logit scales, the bias MLP, q bias) move. T in both heads; B (its
    128-wide pyramid into the detector's neck) and S (T's widths, its own drop path) in one
    each."""
    pytest.importorskip('mmdet')
    pytest.importorskip('mmseg')
    import mmengine
    from test_foundation_configs import build_to_train, train_two_steps
    cfg = mmengine.Config.fromfile(os.path.join(ROOT, 'configs', name))
    cfg.model.backbone.update(depths=[1, 1, 1, 1], init_cfg=None)
    model, wrapper, seg_classes = build_to_train(cfg, precision)
    dims = {'tiny': 96, 'small': 96, 'base': 128}[V2_CONFIGS[name][0]]
    assert model.backbone.num_features == [dims * 2**i for i in range(4)]
    train_two_steps(model, wrapper, model.backbone,
                    ['stages.0.blocks.0.attn.w_msa.logit_scale',
                     'stages.3.blocks.0.attn.w_msa.q_bias',
                     'stages.2.blocks.0.attn.w_msa.cpb_mlp.0.weight'],
                    seg_classes)


def test_release_window_settings_load_the_release_layout(tmp_path):
    """What the configs' backbone expects of Microsoft's window16_256 files: a file saved by a
    window-16 model trained at 256 px (HF's model at image_size 256 shrinks the last stage's
    window to 8, as Microsoft's did) loads with pretrained_window_sizes=(16, 16, 16, 8), and
    the default (every stage at 16) is refused, naming stage 3."""
    cfg = hf_config(16, (1, 1, 1, 1), (1, 2, 4, 8), window=16, image_size=256)
    hf = perturbed(Swinv2Backbone(cfg))
    path = tmp_path / 'window16_256.pth'
    torch.save(hf_to_microsoft_layout(hf), path)
    arch = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), window_size=16)
    with pytest.raises(CheckpointError, match=r'stage 3 .* window 8.*pretrained_window_sizes\[3\]'):
        load_pretrained(SwinTransformerV2(**arch), str(path))
    model = SwinTransformerV2(**arch, pretrained_window_sizes=(16, 16, 16, 8))
    load(model, path)
    # at 256 px (where HF's windows are the pretraining ones) the features agree except in the
    # last stage, which HF runs unshifted on its 8x8 map and we at window 16 (padded)
    x = torch.randn(1, 3, 256, 256)
    raw, _ = our_stage_maps(model.eval(), x)
    want = hf_maps(hf, x)
    assert max_rel_err(raw[0], want[0]) < 1e-5 and max_rel_err(raw[1], want[1]) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize('precision', ['fp32', 'bf16'])
def test_demo_config_trains_a_few_iterations(tmp_path, precision):
    """The CPU demo variant through tools/demo.py's runner (bf16: our CPU AMP wrapper), on a
    tiny generated shapes set: it trains (the config's CheckInvalidLossHook stops a run at the
    first non-finite loss), evaluates and writes its checkpoint."""
    import json
    import sys
    pytest.importorskip('mmdet')
    from mmvitswin.openmmlab.datasets import make_shapes
    sys.path.insert(0, os.path.join(ROOT, 'tools'))
    import demo
    data = str(tmp_path / 'shapes')
    make_shapes(data, num_train=4, num_val=2, image_size=(128, 128), seed=1)
    config = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_swinv2_nano_shapes.py')
    summary = demo.run_demo(config, str(tmp_path / 'work'), data, max_iters=3,
                            precision=precision, log=lambda *a: None)
    record = json.load(open(os.path.join(str(tmp_path / 'work'), 'metrics.json')))
    assert record['max_iters'] == 3 and record['precision'] == precision
    assert os.path.isfile(summary['checkpoint'])
    assert all(math.isfinite(v) for v in record['metrics'].values() if isinstance(v, float))

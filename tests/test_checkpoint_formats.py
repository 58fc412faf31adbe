"""Checkpoint file formats (safetensors, shards, pytorch_model.bin, HF snapshot directories and
hub cache entries) and the HuggingFace ``transformers`` Swin layouts, with random-weight HF
models as the oracle (no download).

What holds against HF (transformers 5.23), checked below:
- ``SwinBackbone`` (``always_partition=True``: full windows and the shift at every stage, the
  map padded to the window *before* the cyclic shift, as mmdet and ours do) matches our
  ``SwinTransformer`` at every stage and every input size, non-multiples of the patch and of
  the window included (both pad the image bottom/right to the patch, each stage to the
  window, odd maps before a merge).
- ``SwinModel``'s default forward (``always_partition=False``) shrinks the window to the map
  and drops the shift on a stage whose map is not larger than the window (and keeps that
  smaller window on the layer afterwards); mmdet's Swin, which ours reproduces, never does.
  The two agree on every stage whose map is larger than the window in both dimensions;
  with ``always_partition=True`` they agree everywhere.
"""
import json
import os
import warnings
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F

safetensors_torch = pytest.importorskip('safetensors.torch')
transformers = pytest.importorskip('transformers')

from mmvitswin.core.backbones.swin import SwinTransformer  # noqa: E402
from mmvitswin.core.checkpoint import (CheckpointError, CheckpointFamily,  # noqa: E402
                                       CheckpointNotFoundError, fit_checkpoint,
                                       load_checkpoint_file, load_pretrained,
                                       read_checkpoint)
from mmvitswin.core.checkpoint.swin import detect_swin_format  # noqa: E402

HF_SMALL = dict(embed_dim=32, depths=[2, 2, 2, 2], num_heads=[2, 2, 4, 4], window_size=4,
                image_size=64, drop_path_rate=0.0)
OURS_SMALL = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(2, 2, 4, 4), window_size=4,
                  pretrain_img_size=64, drop_path_rate=0.0)
SIZES = [(64, 64), (72, 100), (57, 83)]  # square, non-square, neither a multiple of 4 nor 16
STAGES = ['stage1', 'stage2', 'stage3', 'stage4']


# ----------------------------------------------------------------------------- helpers
def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """HF initialises bias tables to zero and norms to 1/0: random values exercise every
    tensor's mapping (a swapped q/k or a wrong merge order changes the features)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if 'norm' in name and name.endswith('weight'):
                p.copy_(1 + 0.1 * noise)
            elif 'relative_position_bias_table' in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.1 * noise)
    return model.eval()


def _hf_swin(cls_name: str, seed: int = 0, **overrides):
    config = transformers.SwinConfig(**dict(HF_SMALL, **overrides), out_features=STAGES)
    torch.manual_seed(seed)
    return _randomise(getattr(transformers, cls_name)(config), seed)


def _state_dict(model) -> 'OrderedDict[str, torch.Tensor]':
    return OrderedDict((k, v.detach().contiguous()) for k, v in model.state_dict().items())


def _write_sharded(sd, directory, shards: int = 3, ext: str = 'safetensors') -> str:
    """Split ``sd`` over ``shards`` files and write the index as the hub does."""
    keys = list(sd)
    per = -(-len(keys) // shards)
    weight_map = {}
    for i in range(shards):
        name = (f'model-{i + 1:05d}-of-{shards:05d}.safetensors' if ext == 'safetensors' else
                f'pytorch_model-{i + 1:05d}-of-{shards:05d}.bin')
        part = OrderedDict((k, sd[k]) for k in keys[i * per:(i + 1) * per])
        if ext == 'safetensors':
            safetensors_torch.save_file(part, os.path.join(directory, name))
        else:
            torch.save(part, os.path.join(directory, name))
        weight_map.update({k: name for k in part})
    index = os.path.join(directory, ('model.safetensors' if ext == 'safetensors' else
                                     'pytorch_model.bin') + '.index.json')
    with open(index, 'w') as f:
        json.dump({'metadata': {'total_size': 0}, 'weight_map': weight_map}, f)
    return index


def _save(model, layout: str, directory) -> str:
    """``model`` (an HF model) written in ``layout``; returns the path a user would give."""
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    sd = _state_dict(model)
    if layout == 'save_pretrained':  # HF's own writer: the hub's key names
        model.save_pretrained(directory)
        return directory
    if layout == 'safetensors':  # a lone file, no config.json beside it
        path = os.path.join(directory, 'swin.safetensors')
        safetensors_torch.save_file(sd, path)
        return path
    model.config.save_pretrained(directory)
    if layout == 'snapshot':
        safetensors_torch.save_file(sd, os.path.join(directory, 'model.safetensors'))
        return directory
    if layout == 'sharded':
        return _write_sharded(sd, directory)
    if layout == 'sharded_bin':
        return _write_sharded(sd, directory, ext='bin')
    if layout == 'bin':
        path = os.path.join(directory, 'pytorch_model.bin')
        torch.save(sd, path)
        return path
    raise AssertionError(layout)


def _ours(checkpoint=None, **kw) -> SwinTransformer:
    init_cfg = None if checkpoint is None else dict(type='Pretrained', checkpoint=str(checkpoint))
    model = SwinTransformer(**dict(OURS_SMALL, **kw), init_cfg=init_cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model.init_weights()
    model.load_warnings = [str(w.message) for w in caught if 'SwinTransformer' in str(w.message)]
    return model.eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _hf_stage_states(hf_model, x, always_partition=True):
    """SwinModel's per-stage outputs before the merge, (B, C, H, W) each (no norm)."""
    out = hf_model(x, output_hidden_states=True, always_partition=always_partition,
                   output_hidden_states_before_downsampling=True)
    return out.reshaped_hidden_states[1:]


def _with_our_norms(ours, states):
    """Our ``norm{i}`` (left as initialised by a SwinModel file) applied to HF stage states."""
    return [F.layer_norm(s.permute(0, 2, 3, 1), s.shape[1:2], getattr(ours, f'norm{i}').weight,
                         getattr(ours, f'norm{i}').bias, getattr(ours, f'norm{i}').eps)
            .permute(0, 3, 1, 2) for i, s in enumerate(states)]


# ------------------------------------------------------------------- HF Swin layouts
LAYOUTS = ['snapshot', 'save_pretrained', 'safetensors', 'sharded', 'sharded_bin', 'bin']


@pytest.mark.parametrize('layout', LAYOUTS)
def test_hf_swin_backbone_reproduces_feature_maps(layout, tmp_path):
    hf = _hf_swin('SwinBackbone', seed=1)
    path = _save(hf, layout, tmp_path / layout)
    ours = _ours(path)
    assert ours.load_warnings == []  # every tensor used, nothing left initialised
    for size in SIZES:
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(size[0]))
        with torch.no_grad():
            want = hf(x).feature_maps
            got = ours(x)
        assert [t.shape for t in got] == [t.shape for t in want]
        for i, (a, b) in enumerate(zip(got, want)):
            assert _rel(a, b) <= 1e-5, (layout, size, i, _rel(a, b))


@pytest.mark.parametrize('cls_name,layout', [('SwinModel', 'snapshot'),
                                             ('SwinModel', 'save_pretrained'),
                                             ('SwinForImageClassification', 'sharded'),
                                             ('SwinForImageClassification', 'save_pretrained')])
def test_hf_swin_model_reproduces_stage_states(cls_name, layout, tmp_path):
    hf = _hf_swin(cls_name, seed=2)
    path = _save(hf, layout, tmp_path / layout)
    ours = _ours(path)
    # SwinModel has no per-stage norms: ours stay initialised and are reported, like the
    # unused final layernorm (and the classifier), in the one leftover warning
    (msg, ) = ours.load_warnings
    assert 'norm0.weight' in msg and 'layernorm.weight' in msg
    assert ('classifier.weight' in msg) == (cls_name == 'SwinForImageClassification')
    trunk = hf.swin if cls_name == 'SwinForImageClassification' else hf
    for size in SIZES:
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(size[1]))
        with torch.no_grad():
            want = _with_our_norms(ours, _hf_stage_states(trunk, x))
            got = ours(x)
        for i, (a, b) in enumerate(zip(got, want)):
            assert a.shape == b.shape and _rel(a, b) <= 1e-5, (size, i, _rel(a, b))


def test_hf_swin_model_default_forward_agrees_where_windows_fit(tmp_path):
    """SwinModel's own forward (window clamped on small maps): equal on every stage whose map
    is larger than the window; at 160x200 that is all four (maps 40x50 ... 5x7, window 4)."""
    hf = _hf_swin('SwinModel', seed=3)
    ours = _ours(_save(hf, 'snapshot', tmp_path))
    x = torch.randn(1, 3, 160, 200, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = _with_our_norms(ours, _hf_stage_states(hf, x, always_partition=False))
        got = ours(x)
    assert [t.shape[-2:] for t in got] == [(40, 50), (20, 25), (10, 13), (5, 7)]
    for i, (a, b) in enumerate(zip(got, want)):
        assert _rel(a, b) <= 1e-5, (i, _rel(a, b))


@pytest.mark.slow(reason='Swin-T-sized HF SwinBackbone side by side')
def test_swin_t_sized_hf_snapshot_matches(tmp_path):
    """One released size: Swin-T (microsoft/swin-tiny-patch4-window7-224's config) as HF's
    save_pretrained writes it, at 224, 200x296 and 333x257."""
    config = transformers.SwinConfig(embed_dim=96, depths=[2, 2, 6, 2],
                                     num_heads=[3, 6, 12, 24], window_size=7, image_size=224,
                                     out_features=STAGES)
    torch.manual_seed(0)
    hf = _randomise(transformers.SwinBackbone(config), seed=4)
    path = _save(hf, 'save_pretrained', tmp_path)
    ours = SwinTransformer(arch='tiny', drop_path_rate=0.,
                           init_cfg=dict(type='Pretrained', checkpoint=path))
    ours.init_weights()
    ours.eval()
    for size in [(224, 224), (200, 296), (333, 257)]:
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(size[0]))
        with torch.no_grad():
            want, got = hf(x).feature_maps, ours(x)
        for i, (a, b) in enumerate(zip(got, want)):
            assert a.shape == b.shape and _rel(a, b) <= 1e-5, (size, i, _rel(a, b))


def test_hf_layouts_are_detected_with_and_without_prefix():
    hf = _hf_swin('SwinBackbone')
    sd = _state_dict(hf)  # transformers 5 names, swin.-prefixed trunk
    assert any(k.startswith('swin.encoder.') and '.q_proj.' in k for k in sd)
    assert detect_swin_format(sd) == 'hf'
    bare = OrderedDict((k[len('swin.'):] if k.startswith('swin.') else k, v)
                       for k, v in sd.items())
    assert detect_swin_format(bare) == 'hf'
    ours_a, ours_b = _ours(), _ours()
    fitted_a = ours_a.convert_checkpoint(sd)
    fitted_b = ours_b.convert_checkpoint(bare)
    assert fitted_a.keys() == fitted_b.keys() == ours_a.state_dict().keys()
    # q, k, v joined in that order
    q = sd['swin.encoder.layers.1.blocks.0.attention.q_proj.weight']
    v = sd['swin.encoder.layers.1.blocks.0.attention.v_proj.weight']
    qkv = fitted_a['stages.1.blocks.0.attn.w_msa.qkv.weight']
    assert torch.equal(qkv[:64], q) and torch.equal(qkv[128:], v)
    assert torch.equal(fitted_a['norm2.weight'], sd['hidden_states_norms.stage3.weight'])


def test_hf_absolute_position_embedding(tmp_path):
    """use_absolute_embeddings: mapped to absolute_pos_embed; resized to other sizes with the
    same bicubic rule as HF's interpolate_pos_encoding (sizes multiple of the patch)."""
    hf = _hf_swin('SwinBackbone', seed=5, use_absolute_embeddings=True)
    ours = _ours(_save(hf, 'snapshot', tmp_path), use_abs_pos_embed=True)
    assert ours.load_warnings == []
    for size in [(64, 64), (64, 96), (80, 48)]:
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(size[1]))
        with torch.no_grad():
            want = hf(x, interpolate_pos_encoding=size != (64, 64)).feature_maps
            got = ours(x)
        for i, (a, b) in enumerate(zip(got, want)):
            assert _rel(a, b) <= 1e-5, (size, i, _rel(a, b))


# ---------------------------------------------------------- what the model cannot represent
def test_absolute_position_embedding_into_a_model_without_one_is_refused(tmp_path):
    hf = _hf_swin('SwinBackbone', use_absolute_embeddings=True)
    path = _save(hf, 'safetensors', tmp_path)  # no config.json: the keys alone decide
    model = _ours()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_pretrained(model, path)
    msg = str(info.value)
    assert info.value.cause == 'other model' and path in msg
    assert 'absolute_pos_embed' in msg and 'use_abs_pos_embed=True' in msg
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_qkv_bias_into_a_model_without_biases_is_refused(tmp_path):
    path = _save(_hf_swin('SwinBackbone'), 'safetensors', tmp_path)
    with pytest.raises(CheckpointError, match=r'qkv\.bias and 7 more like it \(q/k/v biases\)'
                       r'.*build it with qkv_bias=True'):
        load_pretrained(_ours(qkv_bias=False), path)


def test_patch_norm_into_a_model_without_it_is_refused(tmp_path):
    path = _save(_hf_swin('SwinBackbone'), 'safetensors', tmp_path)
    with pytest.raises(CheckpointError, match='patch_norm=True'):
        load_pretrained(_ours(patch_norm=False), path)


def test_a_file_without_patch_norm_into_a_model_with_it_is_refused(tmp_path):
    """The other way round: the model's unit LayerNorm after the patch embedding would run on
    weights trained without one (a warning about missing keys, then other features)."""
    sd = {k: v for k, v in _state_dict(_hf_swin('SwinBackbone')).items()
          if '.embeddings.norm.' not in k}
    path = os.path.join(str(tmp_path), 'no_patch_norm.safetensors')
    safetensors_torch.save_file(sd, path)
    with pytest.raises(CheckpointError, match='patch_norm=False, but this model has '
                       'patch_norm=True'):
        load_pretrained(_ours(), path)
    assert _ours(path, patch_norm=False).load_warnings  # loads (its output norms: reported)


def test_config_json_is_checked_against_the_model(tmp_path):
    """The architecture config.json states is compared: a LayerNorm eps the keys cannot show."""
    hf = _hf_swin('SwinBackbone', layer_norm_eps=1e-6)
    path = _save(hf, 'snapshot', tmp_path)
    with pytest.raises(CheckpointError, match=r'config\.json.*layer_norm_eps=1e-06.*'
                       r'layer_norm_eps=1e-05'):
        load_pretrained(_ours(), path)
    ours = _ours(path, norm_cfg=dict(type='LN', eps=1e-6))  # built to match: loads
    assert ours.load_warnings == []


def test_unrepresentable_rule_is_generic():
    """The engine's rule on a toy family: a file key matching an entry that the model lacks."""
    model = torch.nn.Linear(2, 2)
    family = CheckpointFamily('Toy', lambda sd: (sd, 'toy'), lambda sd: {}, lambda m: {},
                              unrepresentable=((r'\.gamma$', 'LayerScale'), ))
    sd = dict(model.state_dict(), **{'blocks.0.ls1.gamma': torch.ones(2)})
    with pytest.raises(ValueError, match=r'checkpoint has blocks\.0\.ls1\.gamma \(LayerScale\), '
                       r'which this model does not have: build it with LayerScale'):
        fit_checkpoint(family, sd, model)
    assert fit_checkpoint(family, dict(model.state_dict()), model).keys() == {'weight', 'bias'}


def test_convert_receives_the_config_when_the_family_asks():
    seen = []

    def convert(sd, config):
        seen.append(config)
        return sd, 'toy'

    model = torch.nn.Linear(2, 2)
    family = CheckpointFamily('Toy', convert, lambda sd: {}, lambda m: dict(width=2),
                              config_probe=lambda c: dict(width=c.get('hidden_size')),
                              convert_needs_config=True)
    fit_checkpoint(family, dict(model.state_dict()), model, config={'hidden_size': 2})
    fit_checkpoint(family, dict(model.state_dict()), model)
    assert seen == [{'hidden_size': 2}, None]
    with pytest.raises(ValueError, match='width=3'):
        fit_checkpoint(family, dict(model.state_dict()), model, config={'hidden_size': 3})


# ------------------------------------------------------------------ timm layout as safetensors
def _hf_to_timm(sd):
    """HF SwinBackbone keys -> timm >= 0.9's names (written from timm's key list: downsample
    at the start of the next stage, q/k/v as one qkv, final ``norm``), merged channels in
    timm's [dx, dy, c] order, which is HF's."""
    out = OrderedDict()
    qkv = {}
    for k, v in sd.items():
        k = k[len('swin.'):] if k.startswith('swin.') else k
        if k.startswith('hidden_states_norms.'):
            continue
        k = k.replace('embeddings.patch_embeddings.projection.', 'patch_embed.proj.')
        k = k.replace('embeddings.norm.', 'patch_embed.norm.').replace('encoder.layers.', 'layers.')
        parts = k.split('.')
        if len(parts) > 2 and parts[0] == 'layers' and parts[2] == 'downsample':
            k = '.'.join(['layers', str(int(parts[1]) + 1)] + parts[2:])
        k = (k.replace('layernorm_before.', 'norm1.').replace('layernorm_after.', 'norm2.')
             .replace('attention.o_proj.', 'attn.proj.')
             .replace('attention.relative_position_bias.', 'attn.'))
        if 'attention.' in k and '_proj.' in k:  # q_proj / k_proj / v_proj
            stem, which, leaf = k.partition('attention.')[0], k.split('.')[-2], k.split('.')[-1]
            qkv.setdefault(f'{stem}attn.qkv.{leaf}', {})[which] = v
            continue
        out[k.replace('layernorm.', 'norm.')] = v
    for k, parts in qkv.items():
        out[k] = torch.cat([parts['q_proj'], parts['k_proj'], parts['v_proj']])
    out['head.fc.weight'] = torch.zeros(10, 256)
    out['head.fc.bias'] = torch.zeros(10)
    return out


def test_timm_layout_safetensors_loads(tmp_path):
    hf = _hf_swin('SwinModel', seed=6)
    timm_sd = _hf_to_timm(_state_dict(hf))
    assert 'layers.1.downsample.reduction.weight' in timm_sd
    path = str(tmp_path / 'model.safetensors')  # as timm's hub repos ship it
    safetensors_torch.save_file(timm_sd, path)
    ours = _ours(path)
    assert detect_swin_format(load_checkpoint_file(path)) == 'timm'
    x = torch.randn(1, 3, 72, 100, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = _with_our_norms(ours, _hf_stage_states(hf, x))
        got = ours(x)
    for i, (a, b) in enumerate(zip(got, want)):
        assert _rel(a, b) <= 1e-5, (i, _rel(a, b))


# ------------------------------------------------------------------------ reading files
def test_read_checkpoint_kinds_and_config(tmp_path):
    hf = _hf_swin('SwinBackbone')
    snap = _save(hf, 'snapshot', tmp_path / 'snap')
    cases = {snap: 'hf-snapshot', os.path.join(snap, 'model.safetensors'): 'safetensors',
             _save(hf, 'sharded', tmp_path / 'sh'): 'sharded',
             _save(hf, 'bin', tmp_path / 'bin'): 'bin'}
    want = _state_dict(hf)
    for path, kind in cases.items():
        ckpt = read_checkpoint(path)
        assert ckpt.kind == kind and ckpt.source == path
        assert ckpt.config['model_type'] == 'swin' and ckpt.config['embed_dim'] == 32
        assert ckpt.obj.keys() == want.keys()
        assert all(torch.equal(ckpt.obj[k], want[k]) for k in want)
    lone = _save(hf, 'safetensors', tmp_path / 'lone')
    assert read_checkpoint(lone).config is None
    torch.save({'state_dict': want}, tmp_path / 'lone' / 'w.pth')  # a .pth: no config read
    ckpt = read_checkpoint(str(tmp_path / 'lone' / 'w.pth'))
    assert ckpt.kind == 'torch' and ckpt.config is None


def _hub_cache(tmp_path, hf, revision='0123abcd'):
    """A hub cache entry as huggingface_hub lays it out: blobs, snapshot links, refs/main."""
    repo = tmp_path / 'hub' / 'models--org--swin-small'
    snap = repo / 'snapshots' / revision
    blobs = repo / 'blobs'
    staged = tmp_path / 'staged'
    _save(hf, 'snapshot', staged)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for name in ('config.json', 'model.safetensors'):
        blob = blobs / f'blob-{name}'
        os.replace(staged / name, blob)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    (repo / 'refs').mkdir()
    (repo / 'refs' / 'main').write_text(revision)
    return repo, snap


def test_hub_cache_entry_loads_offline(tmp_path, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    hf = _hf_swin('SwinBackbone', seed=7)
    repo, snap = _hub_cache(tmp_path, hf)
    x = torch.randn(1, 3, 72, 100, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(x).feature_maps
    for path in (repo, snap):
        ckpt = read_checkpoint(str(path))
        assert ckpt.kind == 'hf-snapshot' and ckpt.config['depths'] == [2, 2, 2, 2]
        ours = _ours(path)
        assert ours.load_warnings == []
        with torch.no_grad():
            got = ours(x)
        assert all(_rel(a, b) <= 1e-5 for a, b in zip(got, want))


def _expect(path, cause, exc=CheckpointError, *fragments):
    model = _ours()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for attempt in ('read', 'init_cfg'):
        with pytest.raises(exc) as info:
            if attempt == 'read':
                read_checkpoint(str(path))
            else:
                model.init_cfg = dict(type='Pretrained', checkpoint=str(path))
                model.init_weights()
        msg = str(info.value)
        assert info.value.cause == cause and str(path) in msg, msg
        for fragment in fragments:
            assert fragment in msg, msg
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    return msg


def test_truncated_safetensors(tmp_path):
    path = _save(_hf_swin('SwinBackbone'), 'safetensors', tmp_path)
    data = open(path, 'rb').read()
    open(path, 'wb').write(data[:len(data) * 2 // 3])
    _expect(path, 'damaged', CheckpointError, 'truncated')
    open(path, 'wb').write(data[:100])  # cut inside the JSON header
    _expect(path, 'damaged', CheckpointError, 'header')


def test_corrupt_safetensors_header(tmp_path):
    path = _save(_hf_swin('SwinBackbone'), 'safetensors', tmp_path)
    data = bytearray(open(path, 'rb').read())
    data[20:28] = b'\xff' * 8  # not UTF-8 / JSON any more
    open(path, 'wb').write(bytes(data))
    _expect(path, 'damaged', CheckpointError, 'not valid JSON')


def test_safetensors_name_on_other_bytes(tmp_path):
    path = tmp_path / 'model.safetensors'
    path.write_bytes(b'<!DOCTYPE html><html>rate limited</html>' * 4)
    _expect(path, 'not a checkpoint', CheckpointError, 'safetensors')
    empty = tmp_path / 'empty.safetensors'
    empty.write_bytes(b'')
    _expect(empty, 'damaged', CheckpointError, 'empty')


def test_missing_shard(tmp_path):
    index = _save(_hf_swin('SwinBackbone'), 'sharded', tmp_path)
    os.remove(tmp_path / 'model-00002-of-00003.safetensors')
    _expect(index, 'missing', CheckpointNotFoundError, 'model-00002-of-00003.safetensors')


def test_damaged_shard_and_incomplete_weight_map(tmp_path):
    index = _save(_hf_swin('SwinBackbone'), 'sharded', tmp_path)
    shard = tmp_path / 'model-00003-of-00003.safetensors'
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    _expect(index, 'damaged', CheckpointError, 'shard model-00003-of-00003.safetensors')
    shard.write_bytes(data)
    meta = json.load(open(index))
    meta['weight_map']['encoder.extra.weight'] = 'model-00001-of-00003.safetensors'
    json.dump(meta, open(index, 'w'))
    _expect(index, 'damaged', CheckpointError, 'encoder.extra.weight')


def test_directories_without_weights(tmp_path):
    empty = tmp_path / 'empty'
    empty.mkdir()
    _expect(empty, 'not a checkpoint', CheckpointError, 'without model weights')
    config_only = tmp_path / 'config_only'
    _hf_swin('SwinBackbone').config.save_pretrained(str(config_only))
    _expect(config_only, 'not a checkpoint', CheckpointError, 'model.safetensors')
    stale = tmp_path / 'hub' / 'models--a--b'
    (stale / 'snapshots' / 'aaa').mkdir(parents=True)
    (stale / 'refs').mkdir()
    (stale / 'refs' / 'main').write_text('bbb')  # names a snapshot that is not there
    _expect(stale, 'missing', CheckpointNotFoundError, "'bbb'")


def test_dangling_snapshot_link_is_missing(tmp_path):
    repo, snap = _hub_cache(tmp_path, _hf_swin('SwinBackbone'))
    os.remove(repo / 'blobs' / 'blob-model.safetensors')  # a download that never finished
    _expect(repo, 'missing', CheckpointNotFoundError)


def test_non_checkpoint_files(tmp_path):
    notes = tmp_path / 'notes.json'
    notes.write_text(json.dumps({'hello': 1}))
    _expect(notes, 'not a checkpoint', CheckpointError, 'weight_map')
    broken = tmp_path / 'snap'
    _save(_hf_swin('SwinBackbone'), 'snapshot', broken)
    (broken / 'config.json').write_text('{"model_type": "swin",')  # cut short
    _expect(broken, 'damaged', CheckpointError, 'config.json')


def test_safetensors_header_length_starting_with_pickle_byte(tmp_path):
    """A safetensors header of 0x..80 bytes begins with byte 0x80, a pickle's first byte: the
    file is still read as safetensors (its layout is tested before the pickle marker)."""
    import struct

    from safetensors.torch import save_file

    from mmvitswin.core.checkpoint.files import read_checkpoint
    tensors = {'w': torch.arange(6, dtype=torch.float32).view(2, 3)}
    path = str(tmp_path / 'weights.safetensors')
    for pad in range(256):
        save_file(tensors, path, metadata={'pad': 'x' * pad})
        with open(path, 'rb') as f:
            if f.read(1) == b'\x80':
                break
    else:
        raise AssertionError('no padding gave a header length whose first byte is 0x80')
    with open(path, 'rb') as f:
        assert struct.unpack('<Q', f.read(8))[0] % 256 == 0x80
    ckpt = read_checkpoint(path)
    assert ckpt.kind == 'safetensors'
    assert torch.equal(ckpt.obj['w'], tensors['w'])


def test_mmap_reads_the_same_tensors_as_the_library(tmp_path):
    """read_checkpoint(mmap=True) (FSDP2's meta_init loading): every dtype, a tensor at an odd
    byte offset, shards through their index and a zip .pth give the tensors as read normally."""
    gen = torch.Generator().manual_seed(0)
    sd = OrderedDict([
        ('odd', torch.arange(3, dtype=torch.uint8)),  # the next tensors may start misaligned
        ('f32', torch.randn(5, 7, generator=gen)),
        ('bf16', torch.randn(4, 3, generator=gen).bfloat16()),
        ('f16', torch.randn(6, generator=gen).half()),
        ('f64', torch.randn(2, 2, generator=gen).double()),
        ('i64', torch.arange(9).view(3, 3)),
        ('flag', torch.tensor([True, False, True])),
        ('empty', torch.zeros(0, 4)),
    ])
    single = tmp_path / 'one.safetensors'
    safetensors_torch.save_file(sd, str(single))
    (tmp_path / 'shards').mkdir()
    index = _write_sharded(dict(sd), str(tmp_path / 'shards'), shards=2)
    pth = tmp_path / 'one.pth'
    torch.save(dict(sd), pth)
    for path in (single, index, pth):
        got = read_checkpoint(str(path), mmap=True).obj
        assert sorted(got) == sorted(sd), path
        for key, want in sd.items():
            assert got[key].dtype == want.dtype and torch.equal(got[key], want), (path, key)

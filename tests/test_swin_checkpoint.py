"""Checkpoint formats, auto-detection, resizing and architecture checks for SwinTransformer."""
import re
import warnings
from collections import OrderedDict

import pytest
import torch

from mmvitswin.core.checkpoint import (convert_swin_state_dict, detect_swin_format,
                                  unwrap_state_dict)
from mmvitswin.core.backbones.swin import SwinTransformer


def _to_microsoft(sd):
    """Our (mmdet) layout -> the official release layout, written from the Microsoft key list
    (the inverse of mmdet's swin_converter), plus the buffers/heads such files carry."""
    out = OrderedDict()
    for k, v in sd.items():
        if k.endswith('relative_position_index'):
            out[k.replace('stages.', 'layers.', 1).replace('attn.w_msa.', 'attn.')] = v
            continue
        if k.startswith('norm'):
            continue
        nk = k.replace('patch_embed.projection.', 'patch_embed.proj.')
        nk = nk.replace('stages.', 'layers.', 1).replace('attn.w_msa.', 'attn.')
        nk = nk.replace('ffn.layers.0.0.', 'mlp.fc1.').replace('ffn.layers.1.', 'mlp.fc2.')
        if '.downsample.' in k:
            # unfold order [c, dy, dx] -> neighbour-major [dx, dy, c]
            lead, c4 = v.shape[:-1], v.shape[-1]
            n = len(lead)
            v = v.reshape(*lead, c4 // 4, 2, 2).permute(*range(n), n + 2, n + 1, n)
            v = v.reshape(*lead, c4)
        out[nk] = v
    out['layers.0.blocks.1.attn_mask'] = torch.zeros(64, 49, 49)
    out['norm.weight'] = torch.ones(768)
    out['norm.bias'] = torch.zeros(768)
    out['head.weight'] = torch.zeros(1000, 768)
    out['head.bias'] = torch.zeros(1000)
    return out


def _to_timm_new(ms):
    out = OrderedDict()
    for k, v in ms.items():
        m = re.match(r'layers\.(\d+)\.downsample\.(.*)', k)
        if m:
            k = f'layers.{int(m.group(1)) + 1}.downsample.{m.group(2)}'
        out[k.replace('head.', 'head.fc.')] = v
    return out


@pytest.fixture(scope='module')
def mmdet_swin():
    from mmdet.models.backbones.swin import SwinTransformer as Ref
    torch.manual_seed(0)
    ref = Ref(drop_path_rate=0.)
    ref.init_weights()
    ref.eval()
    return ref


def _outputs(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


def _load_via_init_cfg(path, tmp_path=None, **kwargs):
    model = SwinTransformer(init_cfg=dict(type='Pretrained', checkpoint=str(path)),
                            drop_path_rate=0., **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model.init_weights()
    return model, [str(w.message) for w in caught if 'SwinTransformer' in str(w.message)]


@pytest.mark.slow(reason="full Swin-T files through mmdet's converter, outputs compared")
def test_microsoft_format_matches_mmdet_converter(mmdet_swin, tmp_path):
    from mmdet.models.backbones.swin import SwinTransformer as Ref
    from mmdet.models.backbones.swin import swin_converter
    ms = _to_microsoft(mmdet_swin.state_dict())
    # mmdet's own path: convert with its converter, load into its model
    ref = Ref(drop_path_rate=0.)
    ref.init_weights()
    converted = swin_converter(ms)
    ref.load_state_dict({k[len('backbone.'):]: v for k, v in converted.items()}, strict=False)
    # ours: the raw Microsoft file, wrapped as the release is ({'model': ...}), auto-detected
    path = tmp_path / 'swin_tiny_patch4_window7_224.pth'
    torch.save({'model': ms}, path)
    ours, msgs = _load_via_init_cfg(path)
    assert detect_swin_format(ms) == 'microsoft'
    x = torch.randn(1, 3, 96, 112)
    for g, w in zip(_outputs(ours, x), _outputs(ref, x)):
        assert torch.allclose(g, w, atol=1e-5)
    # the head and ImageNet norm are reported unused, in one warning
    assert len(msgs) == 1 and 'head.weight' in msgs[0] and 'norm.weight' in msgs[0]


@pytest.mark.slow(reason="full Swin-T files in five wrappings, outputs compared with mmdet's")
@pytest.mark.parametrize('wrap', ['bare', 'state_dict', 'module', 'backbone', 'timm_new'])
def test_wrappers_and_timm_layout_load_exactly(mmdet_swin, tmp_path, wrap):
    sd = mmdet_swin.state_dict()
    if wrap == 'bare':
        obj = sd
    elif wrap == 'state_dict':
        obj = {'state_dict': sd, 'meta': {'epoch': 3}}
    elif wrap == 'module':
        obj = {'state_dict': {f'module.{k}': v for k, v in sd.items()}}
    elif wrap == 'backbone':
        obj = {'state_dict': {**{f'backbone.{k}': v for k, v in sd.items()},
                              'neck.fpn_convs.0.conv.weight': torch.zeros(1)}}
    else:
        obj = _to_timm_new(_to_microsoft(sd))
        assert detect_swin_format(obj) == 'timm'
    path = tmp_path / f'{wrap}.pth'
    torch.save(obj, path)
    ours, msgs = _load_via_init_cfg(path)
    x = torch.randn(1, 3, 64, 64)
    for g, w in zip(_outputs(ours, x), _outputs(mmdet_swin, x)):
        assert torch.allclose(g, w, atol=1e-5)
    if wrap != 'timm_new':
        assert msgs == []


@pytest.mark.slow(reason="full Swin-T files, outputs compared with mmdet's")
def test_equal_window_loading_changes_nothing(mmdet_swin, tmp_path):
    path = tmp_path / 'same.pth'
    sd = mmdet_swin.state_dict()
    torch.save(sd, path)
    ours, msgs = _load_via_init_cfg(path)
    assert msgs == []
    for k, v in ours.state_dict().items():
        assert torch.equal(v, sd[k]), k


@pytest.mark.slow(reason='full Swin-T files resized, outputs compared')
def test_window_7_to_12_resizes_tables(mmdet_swin, tmp_path):
    path = tmp_path / 'w7.pth'
    sd = mmdet_swin.state_dict()
    torch.save(sd, path)
    ours, msgs = _load_via_init_cfg(path, window_size=12, pretrain_img_size=384)
    assert msgs == []
    key = 'stages.0.blocks.0.attn.w_msa.relative_position_bias_table'
    table = ours.state_dict()[key]
    assert table.shape == (23 * 23, 3)
    # bicubic resize of the 13x13 grid per head
    want = torch.nn.functional.interpolate(
        sd[key].t().reshape(1, 3, 13, 13), size=(23, 23), mode='bicubic',
        align_corners=False).reshape(3, -1).t()
    assert torch.allclose(table, want, atol=1e-6)
    # weights that do not depend on the window are copied unchanged
    assert torch.equal(ours.state_dict()['stages.2.blocks.3.ffn.layers.1.weight'],
                       sd['stages.2.blocks.3.ffn.layers.1.weight'])
    assert tuple(ours(torch.randn(1, 3, 100, 90))[3].shape) == (1, 768, 4, 3)


@pytest.mark.slow(reason='full Swin-T files')
def test_abs_pos_embed_resized_on_load(tmp_path):
    src = SwinTransformer(use_abs_pos_embed=True, pretrain_img_size=224)
    path = tmp_path / 'abs.pth'
    torch.save(src.state_dict(), path)
    ours, msgs = _load_via_init_cfg(path, use_abs_pos_embed=True, pretrain_img_size=384)
    assert msgs == []
    assert ours.absolute_pos_embed.shape == (1, 96 * 96, 96)


def test_different_architecture_raises(tmp_path):
    """Only the keys' structure is read: a Swin-T state dict edited into a Swin-S (18 blocks
    in stage 2) and a Swin-B (width 128) stands in for the real, large files."""
    tiny = SwinTransformer(arch='tiny').state_dict()
    path = tmp_path / 'other.pth'
    small = dict(tiny, **{'stages.2.blocks.17.norm1.weight': torch.ones(384)})
    torch.save(small, path)
    with pytest.raises(ValueError, match=r'depths=\(2, 2, 18, 2\).*depths=\(2, 2, 6, 2\)'):
        _load_via_init_cfg(path)
    base = dict(tiny, **{'patch_embed.projection.weight': torch.zeros(128, 3, 4, 4)})
    torch.save(base, path)
    with pytest.raises(ValueError, match='embed_dims=128.*embed_dims=96'):
        _load_via_init_cfg(path)


def test_unknown_format_and_empty_prefix_raise():
    with pytest.raises(ValueError, match='unrecognised Swin checkpoint format'):
        convert_swin_state_dict({'foo.weight': torch.zeros(1)})
    with pytest.raises(ValueError, match="no keys under prefix 'encoder.'"):
        unwrap_state_dict({'backbone.x': torch.zeros(1)}, prefix='encoder')


def test_leftover_keys_reported_in_one_warning(mmdet_swin, tmp_path):
    sd = dict(mmdet_swin.state_dict())
    del sd['norm3.weight']
    sd['extra.thing'] = torch.zeros(2)
    path = tmp_path / 'partial.pth'
    torch.save(sd, path)
    _, msgs = _load_via_init_cfg(path)
    assert len(msgs) == 1
    assert 'norm3.weight' in msgs[0] and 'extra.thing' in msgs[0]


def _tool_main():
    """tools/convert_checkpoint.py's ``main(argv) -> exit code``, loaded in this process."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tools',
                        'convert_checkpoint.py')
    spec = importlib.util.spec_from_file_location('convert_checkpoint_tool', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.slow(reason='tools/convert_checkpoint.py in subprocesses')
def test_convert_checkpoint_tool(mmdet_swin, tmp_path, capsys):
    import subprocess
    import sys
    ms = _to_microsoft(mmdet_swin.state_dict())
    src, dst = tmp_path / 'ms.pth', tmp_path / 'out.pth'
    torch.save({'model': ms}, src)
    # once as users run it (a script in its own interpreter), then through its main(argv)
    run = [sys.executable, 'tools/convert_checkpoint.py', str(src), str(dst)]
    out = subprocess.run(run, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert 'detected format: microsoft' in out.stdout
    converted = torch.load(dst, weights_only=True)['state_dict']
    model = SwinTransformer(drop_path_rate=0.)
    result = model.load_state_dict(converted, strict=False)
    # an ImageNet release has no per-stage output norms; everything else maps onto a key
    assert sorted(result.missing_keys) == sorted(f'norm{i}.{p}' for i in range(4)
                                                 for p in ('weight', 'bias'))
    assert sorted(result.unexpected_keys) == ['head.bias', 'head.weight', 'norm.bias',
                                              'norm.weight']
    model.load_state_dict({k: v for k, v in mmdet_swin.state_dict().items()
                           if k.startswith('norm')}, strict=False)
    x = torch.randn(1, 3, 64, 64)
    for g, w in zip(_outputs(model, x), _outputs(mmdet_swin, x)):
        assert torch.allclose(g, w, atol=1e-5)
    main = _tool_main()
    capsys.readouterr()
    # an existing output is never overwritten without --force
    before = dst.read_bytes()
    assert main([str(src), str(dst)]) == 2 and 'exists' in capsys.readouterr().err
    assert dst.read_bytes() == before
    # fitted to a window-12 backbone, with a prefix for load_from
    fitted = tmp_path / 'w12.pth'
    assert main([str(src), str(fitted), '--prefix', 'backbone.', '--backbone',
                 '{"type": "SwinTransformer", "window_size": 12}']) == 0, capsys.readouterr().err
    sd = torch.load(fitted, weights_only=True)['state_dict']
    assert sd['backbone.stages.0.blocks.0.attn.w_msa.relative_position_bias_table'].shape == (
        529, 3)
    assert main([str(src), str(tmp_path / 'x.pth'), '--backbone', '{oops']) == 2
    assert '--backbone is not valid JSON' in capsys.readouterr().err

"""Layer-wise lr decay: every group's lr is base_lr * rate ** (num_layers + 1 - depth), with the
depths written out independently here, for ViT-B (ViTAdapter) and Swin-T."""
import re

import pytest
import torch
import torch.nn as nn

import mmvitswin  # noqa: F401  (registers and bridges the constructor)
from mmvitswin.core.backbones.swin import SwinTransformer
from mmvitswin.core.backbones.vit import ViTAdapter
from mmvitswin.openmmlab.registry import OPTIM_WRAPPER_CONSTRUCTORS

BASE_LR, RATE, WD = 1e-3, 0.65, 0.05


class Detector(nn.Module):
    """A backbone plus a neck/head, as mmdet/mmseg models hold them."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.neck = nn.Conv2d(8, 8, 1)
        self.head = nn.Linear(8, 3)


def _build(model, num_layers, registry=OPTIM_WRAPPER_CONSTRUCTORS, **extra):
    constructor = registry.build(dict(
        type='LayerDecayOptimWrapperConstructor',
        optim_wrapper_cfg=dict(type='OptimWrapper', optimizer=dict(
            type='AdamW', lr=BASE_LR, weight_decay=WD)),
        paramwise_cfg=dict(num_layers=num_layers, layer_decay_rate=RATE, **extra)))
    return constructor(model).optimizer


def vit_depth(name: str) -> int:
    if not name.startswith('backbone.'):
        return 13
    name = name[len('backbone.'):]
    if name.startswith('patch_embed') or name in ('cls_token', 'pos_embed'):
        return 0
    m = re.match(r'blocks\.(\d+)\.', name)
    return int(m.group(1)) + 1 if m else 13


# Swin-T depths (2, 2, 6, 2): first overall block index of each stage is 0, 2, 4, 10.
SWIN_T_EXPECTED = {
    'backbone.patch_embed.projection.weight': 0,
    'backbone.stages.0.blocks.0.attn.w_msa.qkv.weight': 1,
    'backbone.stages.0.blocks.1.norm1.weight': 2,
    'backbone.stages.0.downsample.reduction.weight': 2,
    'backbone.stages.1.blocks.0.ffn.layers.0.0.weight': 3,
    'backbone.stages.1.downsample.norm.weight': 4,
    'backbone.stages.2.blocks.0.norm2.bias': 5,
    'backbone.stages.2.blocks.5.attn.w_msa.relative_position_bias_table': 10,
    'backbone.stages.2.downsample.reduction.weight': 10,
    'backbone.stages.3.blocks.0.attn.w_msa.proj.weight': 11,
    'backbone.stages.3.blocks.1.ffn.layers.1.weight': 12,
    'backbone.norm0.weight': 13,
    'backbone.norm3.bias': 13,
    'neck.weight': 13,
    'head.bias': 13,
}


def _check_groups(optimizer, model, depth_of, num_layers):
    names = {id(p): n for n, p in model.named_parameters()}
    seen = []
    for group in optimizer.param_groups:
        for p in group['params']:
            name = names[id(p)]
            seen.append(name)
            depth = depth_of(name)
            assert group['lr'] == pytest.approx(BASE_LR * RATE**(num_layers + 1 - depth)), name
            no_decay = p.ndim == 1 or name.endswith(
                ('pos_embed', 'cls_token', 'relative_position_bias_table'))
            assert group['weight_decay'] == (0. if no_decay else WD), name
    assert sorted(seen) == sorted(n for n, p in model.named_parameters() if p.requires_grad)
    return seen


def test_vit_b_every_group_lr():
    model = Detector(ViTAdapter('base', embed_dims=48, num_heads=3))  # ViT-B depth, small width
    opt = _build(model, 12)
    seen = _check_groups(opt, model, vit_depth, 12)
    assert len(seen) == len(list(model.parameters()))
    lrs = {round(g['lr'] / BASE_LR, 12) for g in opt.param_groups}
    assert len(lrs) == 14  # depths 0..13
    top = [g for g in opt.param_groups if 'head.weight' in g['param_names']][0]
    assert top['lr'] == BASE_LR  # the head at full lr
    emb = [g for g in opt.param_groups if 'backbone.pos_embed' in g['param_names']][0]
    assert emb['lr'] == pytest.approx(BASE_LR * 0.65**13) and emb['weight_decay'] == 0.


def test_swin_t_every_group_lr():
    model = Detector(SwinTransformer(arch='tiny'))
    opt = _build(model, 12)
    names = dict(model.named_parameters())
    assert set(SWIN_T_EXPECTED) <= set(names)

    def swin_depth(name):
        if name in SWIN_T_EXPECTED:
            return SWIN_T_EXPECTED[name]
        if not name.startswith('backbone.'):
            return 13
        m = re.match(r'backbone\.stages\.(\d+)\.blocks\.(\d+)\.', name)
        if m:
            return [0, 2, 4, 10][int(m.group(1))] + int(m.group(2)) + 1
        m = re.match(r'backbone\.stages\.(\d+)\.downsample\.', name)
        if m:
            return [2, 4, 10][int(m.group(1))]
        return 0 if 'patch_embed' in name else 13

    _check_groups(opt, model, swin_depth, 12)


def test_frozen_parameters_left_out_and_bare_backbone():
    backbone = ViTAdapter('tiny', num_layers=4, frozen_stages=1)
    opt = _build(backbone, 4)  # no detector around it: names have no 'backbone.' prefix
    grouped = {n for g in opt.param_groups for n in g['param_names']}
    assert 'blocks.0.norm1.weight' not in grouped and 'pos_embed' not in grouped
    blk1 = [g for g in opt.param_groups if 'blocks.1.attn.qkv.weight' in g['param_names']][0]
    assert blk1['lr'] == pytest.approx(BASE_LR * RATE**3)


def test_usable_from_mmdet_and_mmseg_and_does_not_shadow_mmseg():
    from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS as DET
    from mmseg.registry import OPTIM_WRAPPER_CONSTRUCTORS as SEG
    model = Detector(ViTAdapter('tiny', num_layers=2))
    for registry in (DET, SEG):
        opt = _build(model, 2, registry=registry)
        _check_groups(opt, model, lambda n: min(vit_depth(n), 3), 2)
    assert SEG.get('LayerDecayOptimizerConstructor').__module__.startswith('mmseg')


def test_through_mmengine_build_optim_wrapper():
    from mmengine.optim import build_optim_wrapper
    model = Detector(ViTAdapter('tiny', num_layers=2))
    wrapper = build_optim_wrapper(model, dict(
        type='OptimWrapper', constructor='mmvitswin.LayerDecayOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=BASE_LR, weight_decay=WD),
        paramwise_cfg=dict(layer_decay_rate=RATE)))
    depths = {g['layer_depth'] for g in wrapper.optimizer.param_groups}
    assert depths == {0, 1, 2, 3}
    loss = model.backbone(torch.randn(1, 3, 32, 32))[0].sum()
    loss.backward()
    wrapper.step()  # the groups are valid for the optimizer


@pytest.mark.parametrize('paramwise, match', [
    (dict(num_layers=12, layer_decay_rate=1.5), 'layer_decay_rate'),
    (dict(num_layers=12), 'layer_decay_rate'),
    (dict(num_layers=12, layer_decay_rate=0.6, decay_mult=1.), 'unsupported keys'),
    (dict(num_layers=0, layer_decay_rate=0.6), 'num_layers'),
])
def test_bad_paramwise_cfg(paramwise, match):
    from mmvitswin.openmmlab.engine.layer_decay import LayerDecayOptimWrapperConstructor
    with pytest.raises(ValueError, match=match):
        LayerDecayOptimWrapperConstructor(
            dict(optimizer=dict(type='AdamW', lr=1e-3)), paramwise)


def test_num_layers_mismatch_and_unknown_backbone():
    with pytest.raises(ValueError, match='has 2 blocks'):
        _build(Detector(ViTAdapter('tiny', num_layers=2)), 12)
    with pytest.raises(TypeError, match='ViT or Swin backbone'):
        _build(Detector(nn.Conv2d(3, 8, 3)), 12)

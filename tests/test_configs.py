"""Every config under configs/ builds (in its own scope) and predicts on a small image.

Configs are discovered by glob, so configs added later are covered too. Swin backbones are cut
to one block per stage (same widths) to keep this fast; nothing is downloaded (pretrained
weights are only loaded by ``init_weights``).
"""
import glob
import os
import os.path as osp

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = sorted(
    osp.relpath(p, ROOT) for p in glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True)
    if '_base_' not in p.split(os.sep))
RECIPES = {  # the official-recipe configs this project promises (issue 4)
    'configs/mask_rcnn_swin_t_coco.py': ('tiny', 12),
    'configs/mask_rcnn_swin_t_coco_3x.py': ('tiny', 36),
    'configs/mask_rcnn_swin_s_coco_3x.py': ('small', 36),
    'configs/mask_rcnn_swin_b_coco_3x.py': ('base', 36),
    'configs/upernet_swin_t_ade20k.py': ('tiny', 160000),
    'configs/upernet_swin_s_ade20k.py': ('small', 160000),
    'configs/upernet_swin_b_ade20k.py': ('base', 160000),
}


_PREDICTED = {}  # model config text -> first config that ran it (T and S share one after the cut)


def _load(rel):
    from mmengine.config import Config
    return Config.fromfile(osp.join(ROOT, rel))


def _cut_deep_vit(bb, blocks: int = 2) -> None:
    """A ViT trunk deeper than ViT-B (L, g, 7B) cut to ``blocks`` blocks of the same width
    (the interaction groups, global blocks and frozen prefix with it): the 7B's 40 blocks
    alone are 27 GB in fp32."""
    from mmvitswin.core.backbones.vit import ARCH_ZOO
    if bb.get('type') != 'ViTAdapter' or not isinstance(bb.get('arch'), str):
        return
    if bb.get('num_layers', ARCH_ZOO.get(bb.arch, {}).get('num_layers', 0)) <= 12:
        return
    bb.num_layers = blocks
    if bb.get('frozen_stages', -1) > blocks:
        bb.frozen_stages = blocks
    if bb.get('adapter') == 'interaction':
        bb.adapter_cfg.interaction_indexes = [(i, i + 1) for i in range(blocks)]
    if bb.get('global_attn_indexes'):
        bb.global_attn_indexes = (blocks - 1, )


def test_configs_are_discovered():
    assert set(RECIPES) <= set(CONFIGS)


@pytest.mark.slow(reason='builds and runs the whole detector/segmentor of every config')
@pytest.mark.timeout(900)
@pytest.mark.parametrize('rel', CONFIGS)
def test_config_builds_and_predicts(rel):
    import mmvitswin  # noqa: F401
    from mmengine.registry import DefaultScope
    from mmvitswin.openmmlab.engine.launch import replace_sync_bn

    cfg = _load(rel)
    assert cfg.custom_imports['imports'][0] == 'mmvitswin'
    assert cfg.custom_imports.get('allow_failed_imports') is False
    scope = cfg.get('default_scope')
    assert scope in ('mmdet', 'mmseg'), f'{rel}: no forward recipe for scope {scope!r}'
    replace_sync_bn(cfg.model)  # what tools/train.py does outside distributed CUDA runs
    if cfg.model.backbone.get('type') in ('SwinTransformer', 'SwinTransformerV2'):
        # one block per stage keeps every width (what the necks/heads see) but builds fast
        cfg.model.backbone.depths = [1] * len(cfg.model.backbone.get('depths') or [0] * 4)
    _cut_deep_vit(cfg.model.backbone)
    key = f'{scope}:{cfg.model!r}'
    if key in _PREDICTED:  # identical model already built and run by another config
        pytest.skip(f'same model as {_PREDICTED[key]} (already built and run)')
    _PREDICTED[key] = rel
    h, w = 72, 100  # not a multiple of the window or of 32: exercises padding
    torch.manual_seed(0)
    img = (torch.rand(3, h, w) * 255).to(torch.uint8)
    meta = dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1., 1.), pad_shape=(h, w))
    with DefaultScope.overwrite_default_scope(scope):
        if scope == 'mmdet':
            from mmdet.registry import MODELS
            from mmdet.structures import DetDataSample as Sample
        else:
            from mmseg.registry import MODELS
            from mmseg.structures import SegDataSample as Sample
        model = MODELS.build(cfg.model)
    assert type(model.backbone).__module__.startswith('mmvitswin.'), type(model.backbone)
    model.eval()
    data = model.data_preprocessor(dict(inputs=[img], data_samples=[Sample(metainfo=meta)]),
                                   False)
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])
        preds = model(**data, mode='predict')
    assert len(preds) == 1
    assert all(torch.isfinite(f).all() for f in feats)
    if scope == 'mmdet':
        # FPN levels at strides 4..64 of the padded input
        ph, pw = data['inputs'].shape[-2:]
        assert [tuple(f.shape[-2:]) for f in feats] == [
            (-(-ph // s), -(-pw // s)) for s in (4, 8, 16, 32, 64)]
        inst = preds[0].pred_instances
        assert inst.bboxes.shape[1:] == (4, ) and len(inst.scores) == len(inst.labels)
    else:
        num_classes = cfg.model.decode_head.num_classes
        seg = preds[0].seg_logits.data
        assert seg.shape == (num_classes, h, w)
        assert preds[0].pred_sem_seg.data.shape == (1, h, w)


@pytest.mark.parametrize('rel', sorted(RECIPES))
def test_recipe_values(rel):
    """The official recipes: optimiser, decay exemptions, schedule, pretrained URL, data root."""
    cfg = _load(rel)
    arch, length = RECIPES[rel]
    bb = cfg.model.backbone
    assert bb.type == 'SwinTransformer' and bb.arch == arch
    assert bb.init_cfg.type == 'Pretrained'
    assert bb.init_cfg.checkpoint == ('https://github.com/SwinTransformer/storage/releases/'
                                      f'download/v1.0.0/swin_{arch}_patch4_window7_224.pth')
    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'AdamW' and tuple(opt.betas) == (0.9, 0.999)
    keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
    assert {k: v['decay_mult'] for k, v in keys.items()} == {
        'absolute_pos_embed': 0., 'relative_position_bias_table': 0., 'norm': 0.}
    if cfg.default_scope == 'mmdet':
        assert (opt.lr, opt.weight_decay) == (1e-4, 0.05)
        assert cfg.train_cfg.max_epochs == length
        assert cfg.train_dataloader.dataset.data_root == 'data/coco/'
        # multi-scale training: 480..800 shorter side, or the resize-crop-resize branch
        choice = next(t for t in cfg.train_dataloader.dataset.pipeline
                      if t.type == 'RandomChoice')
        scales = choice.transforms[0][0].scales
        assert [s[0] for s in scales] == list(range(480, 801, 32))
        assert [t.type for t in choice.transforms[1]] == [
            'RandomChoiceResize', 'RandomCrop', 'RandomChoiceResize']
        milestones = cfg.param_scheduler[-1].milestones
        assert milestones == ([8, 11] if length == 12 else [27, 33])
        dims = {'tiny': 96, 'small': 96, 'base': 128}[arch]
        assert cfg.model.neck.in_channels == [dims * 2**i for i in range(4)]
    else:
        assert (opt.lr, opt.weight_decay) == (6e-5, 0.01)
        assert cfg.train_cfg.max_iters == length
        assert cfg.param_scheduler[-1].type == 'PolyLR'
        assert cfg.train_dataloader.dataset.data_root == 'data/ade/ADEChallengeData2016'
        crop = next(t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomCrop')
        assert tuple(crop.crop_size) == (512, 512)
        assert cfg.model.decode_head.norm_cfg.type == 'SyncBN'  # switched by the tools
        dims = {'tiny': 96, 'small': 96, 'base': 128}[arch]
        assert cfg.model.decode_head.in_channels == [dims * 2**i for i in range(4)]
        assert cfg.model.auxiliary_head.in_channels == dims * 4

"""The foundation-ViT configs (DINOv2-B and DINOv3-B ``ViTAdapter`` with both adapters, the SAM-B
simple pyramid; Mask R-CNN and UPerNet) train: each config's model, with the trunk narrowed but
its preset kept (patch 14 / RoPE / registers / LayerScale / windows + global blocks), takes two
optimisation steps under the CPU bf16 AMP wrapper that ``tools/train.py --amp`` selects, through
the config's own optimiser constructor (layer decay), on odd-size images. The losses are
finite and the trunk moves, LayerScale and tokens included. The necks and heads (mmdet's and
mmseg's) keep their structure at an eighth of their widths: on a CPU without bf16 instructions
PyTorch runs bf16 convolutions and matmuls outside oneDNN, and the full-width heads made each
test minutes long there. (Building every config at full width and predicting:
tests/test_configs.py.)"""
import os.path as osp

import pytest
import torch

pytestmark = pytest.mark.slow(
    reason='two bf16 training steps of each DINOv2/DINOv3/SAM Mask R-CNN and UPerNet config')

pytest.importorskip('mmdet')
pytest.importorskip('mmseg')

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = (
    'mask_rcnn_vit_adapter_dinov2_b_coco_1x.py',
    'mask_rcnn_vit_adapter_dinov2_b_simple_coco_1x.py',
    'mask_rcnn_vit_adapter_dinov3_b_coco_1x.py',
    'mask_rcnn_vit_adapter_dinov3_b_simple_coco_1x.py',
    'mask_rcnn_vitdet_sam_b_coco.py',
    'upernet_vit_adapter_dinov2_b_ade20k.py',
    'upernet_vit_adapter_dinov2_b_simple_ade20k.py',
    'upernet_vit_adapter_dinov3_b_ade20k.py',
    'upernet_vit_adapter_dinov3_b_simple_ade20k.py',
    'upernet_vitdet_sam_b_ade20k.py',
)
# what each preset must still be after narrowing: (attribute, value) on the built trunk
FAMILY = {
    'dinov2': dict(patch_size=14, layer_scale_init_value=1e-5),
    'dinov3': dict(patch_size=16, num_register_tokens=4, layer_scale_init_value=1e-5),
    'sam': dict(patch_size=16, use_rel_pos=True),
}
WIDTH, HEADS = 64, 2


def _narrow(cfg) -> str:
    """Four blocks of width 64 on the config's own preset (an explicit width wins over it)."""
    bb = cfg.model.backbone
    family = bb.arch.split('-')[0]
    assert family in FAMILY and bb.arch.endswith('-b'), bb.arch
    bb.update(embed_dims=WIDTH, num_layers=4, num_heads=HEADS, init_cfg=None)
    if bb.get('window_size') or family == 'sam':  # SAM's windows are its preset's default
        bb.global_attn_indexes = (1, 3)
    bb.pop('pretrained', None)
    if bb.adapter == 'interaction':
        bb.adapter_cfg.update(interaction_indexes=[(0, 2), (2, 4)], num_heads=HEADS,
                              conv_inplane=16)
    out = bb.get('adapter_cfg', {}).get('out_channels', WIDTH)
    if 'neck' in cfg.model and 'in_channels' in cfg.model.neck:  # Mask R-CNN's FPN
        cfg.model.neck.in_channels = [out] * 4
    if 'decode_head' in cfg.model:  # UPerNet
        cfg.model.decode_head.in_channels = [out] * 4
        cfg.model.auxiliary_head.in_channels = out
    paramwise = cfg.optim_wrapper.get('paramwise_cfg') or {}
    if 'num_layers' in paramwise:
        paramwise['num_layers'] = 4
    return family


# the widths that take the trunk's outputs; every other ``*channels`` width outside the backbone
# is divided by HEAD_SHRINK
TRUNK_FACING = {(('neck',), 'in_channels'), (('decode_head',), 'in_channels'),
                (('auxiliary_head',), 'in_channels')}
HEAD_SHRINK = 8


def narrow_heads(model_cfg) -> None:
    """Divide the integer channel widths of ``model_cfg``'s neck and heads by HEAD_SHRINK in
    place (FPN 256 -> 32, box head FC 1024 -> 128, UPerNet 512 -> 64), leaving the backbone and
    the widths that receive its outputs as they are."""
    def visit(node, path):
        for key, value in node.items():
            if isinstance(value, dict):
                visit(value, path + (key,))
            elif (key.endswith('channels') and isinstance(value, int) and path
                  and (path, key) not in TRUNK_FACING):
                assert value % HEAD_SHRINK == 0, ('.'.join(path + (key,)), value)
                node[key] = value // HEAD_SHRINK
    visit({k: v for k, v in model_cfg.items() if k != 'backbone'}, ())


def _det_batch():
    from mmdet.testing import demo_mm_inputs
    return demo_mm_inputs(2, image_shapes=[(3, 97, 123), (3, 128, 90)], num_items=[3, 2],
                          num_classes=80, with_mask=True)


def _seg_batch(num_classes: int):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    inputs, samples = [], []
    for h, w in ((97, 123), (128, 90)):
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8))
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w),
                                             pad_shape=(h, w)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, h, w)))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def build_to_train(cfg, precision: str = 'bf16'):
    """``cfg``'s model and the optimizer its own ``optim_wrapper`` builds, as tools/train.py
    sets them up on a CPU (SyncBN replaced; ``precision='bf16'``: the ``--amp`` wrapper), in
    the config's scope, with the necks and heads narrowed by ``narrow_heads``; segmentation
    models pass odd sizes through (padded to 32). Returns ``(model, wrapper, seg_classes)``,
    ``seg_classes`` None for a detector."""
    import mmvitswin  # noqa: F401
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    from mmvitswin.openmmlab.engine.amp import apply_amp
    from mmvitswin.openmmlab.engine.launch import replace_sync_bn

    replace_sync_bn(cfg.model)
    narrow_heads(cfg.model)
    if precision == 'bf16':
        apply_amp(cfg.optim_wrapper, cuda=False, dtype='bf16')
    seg = 'decode_head' in cfg.model
    if seg:
        from mmseg.registry import MODELS
        cfg.model.data_preprocessor.size = None  # odd sizes straight through (padded to 32)
        cfg.model.data_preprocessor.size_divisor = 32
    else:
        from mmdet.registry import MODELS
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope('mmseg' if seg else 'mmdet'):
        model = MODELS.build(cfg.model)
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    return model, wrapper, cfg.model.decode_head.num_classes if seg else None


def train_two_steps(model, wrapper, trunk, watched, seg_classes=None) -> None:
    """Two ``train_step`` calls of ``model`` through ``wrapper`` on odd-size images (a
    segmentation batch of ``seg_classes`` classes, else a detection batch): the losses are
    finite and every parameter of ``trunk`` named in ``watched`` moves."""
    before = {n: trunk.get_parameter(n).detach().clone() for n in watched}
    batch = _det_batch() if seg_classes is None else _seg_batch(seg_classes)
    model.train()
    for _ in range(2):
        log = model.train_step(batch, wrapper)
        assert log and all(torch.isfinite(v).all() for v in log.values()), log
    for name, value in before.items():
        assert not torch.equal(value, trunk.get_parameter(name)), name


@pytest.mark.parametrize('name', CONFIGS)
def test_foundation_config_trains_two_bf16_amp_steps(name):
    from mmengine.config import Config

    cfg = Config.fromfile(osp.join(ROOT, 'configs', name))
    family = _narrow(cfg)
    model, wrapper, seg_classes = build_to_train(cfg, 'bf16')
    trunk = model.backbone
    for attr, value in FAMILY[family].items():
        assert getattr(trunk, attr) == value, (attr, getattr(trunk, attr))
    assert trunk.embed_dims == WIDTH and trunk.num_layers == 4
    watched = [n for n, _ in trunk.named_parameters()
               if n in ('blocks.0.attn.qkv.weight', 'patch_embed.proj.weight')
               or n.endswith(('blocks.3.ls2.gamma', 'register_tokens', 'rel_pos_h'))]
    assert len(watched) >= 2, watched
    train_two_steps(model, wrapper, trunk, watched, seg_classes)

# Mask R-CNN, ViT-S (DeiT-S) + ViT-Adapter (interaction mode), FPN, COCO 2017, 3x: the
# ViT-Adapter-S recipe (6 deformable heads, deform_ratio 1.0, drop path 0.2, layer decay 0.65).
_base_ = './mask_rcnn_vit_adapter_b_coco.py'

pretrained = 'https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth'
model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.2,
        adapter_cfg=dict(num_heads=6, deform_ratio=1.0),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[384, 384, 384, 384]))

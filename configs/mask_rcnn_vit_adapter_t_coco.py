# Mask R-CNN, ViT-T (DeiT-T) + ViT-Adapter (interaction mode), FPN, COCO 2017, 3x: the
# ViT-Adapter-T recipe (6 deformable heads, deform_ratio 1.0, drop path 0.1, layer decay 0.65).
_base_ = './mask_rcnn_vit_adapter_b_coco.py'

pretrained = 'https://dl.fbaipublicfiles.com/deit/deit_tiny_patch16_224-a1311bcf.pth'
model = dict(
    backbone=dict(
        arch='tiny',
        drop_path_rate=0.1,
        adapter_cfg=dict(num_heads=6, deform_ratio=1.0),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[192, 192, 192, 192]))

# Mask R-CNN, Swin-S, FPN, COCO 2017, 3x (36 epochs), official recipe (drop path 0.2).
_base_ = './mask_rcnn_swin_t_coco_3x.py'
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_small_patch4_window7_224.pth'  # noqa: E501
model = dict(
    backbone=dict(
        type='SwinTransformer',
        arch='small',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

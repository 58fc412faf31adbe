# Mask R-CNN, Swin-B (ImageNet-1K, window 7), FPN, COCO 2017, 3x (36 epochs); drop path 0.3 as
# in the official Swin-B detection recipe.
_base_ = './mask_rcnn_swin_t_coco_3x.py'
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_base_patch4_window7_224.pth'  # noqa: E501
model = dict(
    backbone=dict(
        type='SwinTransformer',
        arch='base',
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[128, 256, 512, 1024]))

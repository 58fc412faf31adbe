# Mask R-CNN, Swin-T backbone, FPN, COCO 2017, 1x (12 epochs): the official Swin-T 1x recipe
# (multi-scale 480-800 training with the DETR-style random crop branch, AdamW lr 1e-4, wd 0.05,
# batch 16 = 8 processes x 2 images).
_base_ = [
    './_base_/models/mask_rcnn_swin_fpn.py',
    './_base_/datasets/coco_instance_ms_crop.py',
    './_base_/schedules/schedule_1x.py',
    './_base_/det_runtime.py',
]
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)

# Microsoft's ImageNet-1K release; the format is detected on load, so a local copy of the same
# file (or an mmdet/timm conversion of it) works too: `--cfg-options
# model.backbone.init_cfg.checkpoint=/path/swin_tiny_patch4_window7_224.pth`.
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'  # noqa: E501
model = dict(
    backbone=dict(
        type='SwinTransformer',
        arch='tiny',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

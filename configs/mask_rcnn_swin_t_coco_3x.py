# Mask R-CNN, Swin-T, FPN, COCO 2017, 3x (36 epochs): the official Swin-T 3x recipe (the 1x
# recipe with lr x0.1 at epochs 27 and 33).
_base_ = [
    './_base_/models/mask_rcnn_swin_fpn.py',
    './_base_/datasets/coco_instance_ms_crop.py',
    './_base_/schedules/schedule_3x.py',
    './_base_/det_runtime.py',
]
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)

pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'  # noqa: E501
model = dict(
    backbone=dict(
        type='SwinTransformer',
        arch='tiny',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

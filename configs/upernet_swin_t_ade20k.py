# UPerNet, Swin-T, ADE20K, 512x512 crops, 160k iterations: the official Swin-T recipe (AdamW
# lr 6e-5, wd 0.01, poly decay, batch 16 = 8 processes x 2 images, drop path 0.3).
_base_ = [
    './_base_/models/upernet_swin.py',
    './_base_/datasets/ade20k.py',
    './_base_/schedules/schedule_160k.py',
    './_base_/seg_runtime.py',
]
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)

crop_size = (512, 512)
# Microsoft's ImageNet-1K release (format detected on load; a local path works offline).
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth'  # noqa: E501
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        type='SwinTransformer',
        arch='tiny',
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 384, 768], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150))

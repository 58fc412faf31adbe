# UPerNet, Swin-B (ImageNet-1K, window 7), ADE20K, 512x512 crops, 160k iterations
# (official recipe, drop path 0.3).
_base_ = './upernet_swin_t_ade20k.py'
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_base_patch4_window7_224.pth'  # noqa: E501
model = dict(
    backbone=dict(
        type='SwinTransformer',
        arch='base',
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))

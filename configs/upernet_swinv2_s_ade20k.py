# UPerNet, Swin V2-S (window 16), ADE20K, 512x512 crops, 160k iterations: the Swin V2-T config
# with the small preset and its 256-px window-16 checkpoint.
_base_ = './upernet_swinv2_t_ade20k.py'
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v2.0.0/swinv2_small_patch4_window16_256.pth'  # noqa: E501
model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)),
             decode_head=dict(in_channels=[96, 192, 384, 768]),
             auxiliary_head=dict(in_channels=384))

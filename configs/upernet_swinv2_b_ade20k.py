# UPerNet, Swin V2-B (window 16), ADE20K, 512x512 crops, 160k iterations: the Swin V2-T config
# with the base preset and its 256-px window-16 checkpoint.
_base_ = './upernet_swinv2_t_ade20k.py'
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v2.0.0/swinv2_base_patch4_window16_256.pth'  # noqa: E501
model = dict(backbone=dict(arch='base', init_cfg=dict(checkpoint=pretrained)),
             decode_head=dict(in_channels=[128, 256, 512, 1024]),
             auxiliary_head=dict(in_channels=512))

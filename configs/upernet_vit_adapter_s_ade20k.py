# UPerNet, ViT-S (DeiT-S) + ViT-Adapter (interaction mode), ADE20K, 512x512, 160k iterations.
_base_ = './upernet_vit_adapter_b_ade20k.py'

pretrained = 'https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth'
model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.2,
        adapter_cfg=dict(num_heads=6, deform_ratio=1.0),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[384, 384, 384, 384]),
    auxiliary_head=dict(in_channels=384))

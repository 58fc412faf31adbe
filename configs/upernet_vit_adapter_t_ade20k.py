# UPerNet, ViT-T (DeiT-T) + ViT-Adapter (interaction mode), ADE20K, 512x512, 160k iterations.
_base_ = './upernet_vit_adapter_b_ade20k.py'

pretrained = 'https://dl.fbaipublicfiles.com/deit/deit_tiny_patch16_224-a1311bcf.pth'
model = dict(
    backbone=dict(
        arch='tiny',
        drop_path_rate=0.1,
        adapter_cfg=dict(num_heads=6, deform_ratio=1.0),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[192, 192, 192, 192]),
    auxiliary_head=dict(in_channels=192))

# UPerNet, DINOv3 ViT-B/16 with ViTDet's simple feature pyramid (4 levels of 256 channels,
# strides 4-32), ADE20K, 512x512 crops, 160k iterations. mmseg's ViT-B UPerNet recipe
# (MAE/BEiT): AdamW lr 1e-4 wd 0.05, layer-wise lr decay 0.65, drop path 0.1. The trunk is
# DINOv3's (arch='dinov3-b'), all blocks global with the 2-D RoPE, as pretrained.
_base_ = './upernet_vit_adapter_dinov3_b_ade20k.py'

pretrained = 'checkpoints/dinov3-vitb16-pretrain-lvd1689m'  # HF snapshot dir (gated)
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='dinov3-b',
        drop_path_rate=0.1,
        adapter='simple',
        adapter_cfg=dict(out_channels=256),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[256, 256, 256, 256]),
    auxiliary_head=dict(in_channels=256))

optim_wrapper = dict(
    optimizer=dict(lr=0.0001, weight_decay=0.05),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.65))

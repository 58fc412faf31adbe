# UPerNet, DINOv2 ViT-B/14 + simple feature pyramid (256 channels), ADE20K 512 x 512, 160k:
# AdamW lr 1e-4 wd 0.05, layer-wise lr decay 0.65, drop path 0.1.
_base_ = './upernet_vit_adapter_dinov2_b_ade20k.py'

pretrained = 'checkpoints/dinov2-base'  # HF snapshot dir, Meta .pth or timm file
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='dinov2-b',
        drop_path_rate=0.1,
        adapter='simple',
        adapter_cfg=dict(out_channels=256),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[256, 256, 256, 256]),
    auxiliary_head=dict(in_channels=256))

optim_wrapper = dict(
    optimizer=dict(lr=0.0001, weight_decay=0.05),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.65))

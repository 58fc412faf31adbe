# UPerNet, SAM-B image encoder with ViTDet's simple feature pyramid (4 levels of 256 channels,
# strides 4-32), ADE20K, 512x512 crops, 160k iterations. The trunk is SAM's (arch='sam-b':
# windows of 14, global blocks 2, 5, 8, 11, decomposed relative positions; the 64 x 64
# position grid resized bicubically to the 32 x 32 crop grid); mmseg's ViT-B (MAE) UPerNet
# recipe on top: AdamW lr 1e-4 wd 0.05, layer-wise lr decay 0.65, drop path 0.1.
_base_ = './upernet_vit_adapter_b_ade20k.py'

pretrained = 'https://dl.fbaipublicfiles.com/segment_anything/sam_vit_b_01ec64.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='sam-b',
        drop_path_rate=0.1,
        adapter='simple',
        adapter_cfg=dict(out_channels=256),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[256, 256, 256, 256]),
    auxiliary_head=dict(in_channels=256))

optim_wrapper = dict(
    optimizer=dict(lr=0.0001, weight_decay=0.05),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.65))

# UPerNet, ViT-B + ViT-Adapter (interaction mode), ADE20K, 512x512 crops, 160k iterations.
# AdamW lr 6e-5 wd 0.01, layer-wise lr decay 0.9, drop path 0.3, DeiT-B init; the adapter's
# 4 levels (768 channels each, strides 4-32) feed UPerNet directly.
_base_ = [
    './_base_/models/upernet_swin.py',
    './_base_/datasets/ade20k.py',
    './_base_/schedules/schedule_160k.py',
    './_base_/seg_runtime.py',
]
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)

crop_size = (512, 512)
pretrained = 'https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth'
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='base',
        img_size=224,
        drop_path_rate=0.3,
        with_cls_token=False,
        adapter='interaction',
        adapter_cfg=dict(
            interaction_indexes=[(0, 3), (3, 6), (6, 9), (9, 12)],
            num_heads=12,
            conv_inplane=64,
            n_points=4,
            deform_ratio=0.5,
            cffn_ratio=0.25,
            init_values=0.,
            norm_cfg=dict(type='SyncBN')),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[768, 768, 768, 768], num_classes=150, channels=512),
    auxiliary_head=dict(in_channels=768, num_classes=150))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.9))

# UPerNet, hybrid R50+ViT-B/16 (HybridViT), ADE20K, 512x512 crops, 160k iterations.
# The backbone's 4 levels (256, 512, 768, 768 channels at strides 4-32) feed UPerNet directly;
# the auxiliary FCN head reads the stride-16 ViT level. AdamW lr 6e-5 wd 0.01 with layer-wise
# lr decay 0.9 (the CNN front end is the ViT's embedding: depth 0), poly schedule, drop path 0.1.
_base_ = [
    './_base_/models/upernet_swin.py',
    './_base_/datasets/ade20k.py',
    './_base_/schedules/schedule_160k.py',
    './_base_/seg_runtime.py',
]
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)

crop_size = (512, 512)
# timm's ImageNet-21k R50+ViT-B/16 hybrid, detected on load (pos-embed resized, classifier
# reported as unused); a local path works offline.
pretrained = 'https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vitjx/jx_vit_base_resnet50_224_in21k-6f7c7740.pth'  # noqa: E501
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        _delete_=True,
        type='HybridViT',
        arch='base',
        img_size=224,
        cnn_depths=(3, 4, 9),
        cnn_channels=(256, 512, 1024),
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        out_channels=None,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[256, 512, 768, 768], num_classes=150),
    auxiliary_head=dict(in_channels=768, in_index=2, num_classes=150))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.9))

# Mask R-CNN, hybrid R50+ViT-B/16 (HybridViT: ResNetV2 front end with StdConv + GroupNorm,
# stages 3-4-9, then ViT-B on the stride-16 map), FPN, COCO 2017, 3x (36 epochs) with
# multi-scale + crop training. Pyramid: CNN stages 1-2 (256 / 512 channels, strides 4 / 8), the
# ViT output (768, stride 16) and its 2x2 max-pool (768, stride 32); the FPN adds stride 64.
# AdamW lr 1e-4 wd 0.05 with layer-wise lr decay 0.75 (the CNN is the ViT's embedding: depth
# 0), drop path 0.1 in the ViT blocks.
_base_ = [
    './_base_/models/mask_rcnn_swin_fpn.py',
    './_base_/datasets/coco_instance_ms_crop.py',
    './_base_/schedules/schedule_3x.py',
    './_base_/det_runtime.py',
]
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)

# timm's ImageNet-21k R50+ViT-B/16 hybrid (vit_base_r50_s16_224_in21k); the layout is detected
# on load, the classifier (head, pre_logits) is reported as unused and the pos-embed is resized
# to every input at run time. The ImageNet-1k 384 model works too (its 24x24 pos-embed is
# resized to img_size / 16): .../jx_vit_base_resnet50_384-9fd3c705.pth. A local path works
# offline: --cfg-options model.backbone.init_cfg.checkpoint=/path/to/file.pth
pretrained = 'https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vitjx/jx_vit_base_resnet50_224_in21k-6f7c7740.pth'  # noqa: E501
model = dict(
    backbone=dict(
        _delete_=True,
        type='HybridViT',
        arch='base',
        img_size=224,
        cnn_depths=(3, 4, 9),
        cnn_channels=(256, 512, 1024),
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        out_channels=None,  # native channels, the FPN's lateral convs project them
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[256, 512, 768, 768]))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.75),
    clip_grad=dict(max_norm=10.0, norm_type=2))

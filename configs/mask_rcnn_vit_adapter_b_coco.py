# Mask R-CNN, ViT-B + ViT-Adapter (interaction mode: spatial prior module and injector/extractor
# deformable cross-attention around 4 groups of 3 blocks), FPN, COCO 2017, 3x (36 epochs) with
# multi-scale + crop training. Recipe of ViT-Adapter-B (DeiT-B init): window attention (14) in
# all blocks but 2, 5, 8, 11, AdamW lr 1e-4 wd 0.05, layer-wise lr decay 0.65, drop path 0.3.
# The simple-feature-pyramid (ViTDet) variant: mask_rcnn_vit_adapter_b_simple_coco.py.
_base_ = [
    './_base_/models/mask_rcnn_swin_fpn.py',
    './_base_/datasets/coco_instance_ms_crop.py',
    './_base_/schedules/schedule_3x.py',
    './_base_/det_runtime.py',
]
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)

# timm/DeiT layout, detected on load; the pos-embed is resized to every input at run time.
pretrained = 'https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='base',
        img_size=224,
        drop_path_rate=0.3,
        with_cls_token=False,  # ViT-Adapter runs the blocks on patch tokens only
        window_size=14,
        global_attn_indexes=(2, 5, 8, 11),
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
    neck=dict(in_channels=[768, 768, 768, 768]))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.65))

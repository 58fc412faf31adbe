# UPerNet, DINOv2 ViT-B/14 + ViT-Adapter (interaction), ADE20K 512 x 512, 160k iterations.
# ViT-Adapter-B's segmentation recipe: AdamW lr 6e-5 wd 0.01, layer-wise lr decay 0.9, drop
# path 0.3; all blocks global (512 px is a 37 x 37 grid of patch 14, DINOv2's own).
_base_ = './upernet_vit_adapter_b_ade20k.py'

pretrained = 'checkpoints/dinov2-base'  # HF snapshot dir, Meta .pth or timm file
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='dinov2-b',
        drop_path_rate=0.3,
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
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)))

optim_wrapper = dict(
    optimizer=dict(lr=0.00006, weight_decay=0.01),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.9))

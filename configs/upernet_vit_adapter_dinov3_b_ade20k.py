# UPerNet, DINOv3 ViT-B/16 + ViT-Adapter (interaction mode), ADE20K, 512x512 crops, 160k
# iterations. ViT-Adapter-B's UPerNet recipe: AdamW lr 6e-5 wd 0.01, layer-wise lr decay 0.9,
# drop path 0.3; the adapter's 4 levels (768 channels, strides 4-32) feed UPerNet directly.
# The trunk is DINOv3's (arch='dinov3-b': CLS + 4 registers, LayerScale, 2-D RoPE, no absolute
# position embedding), all blocks global as pretrained.
_base_ = './upernet_vit_adapter_b_ade20k.py'

# gated weights: see mask_rcnn_vit_adapter_dinov3_b_coco_3x.py for where to get them
pretrained = 'checkpoints/dinov3-vitb16-pretrain-lvd1689m'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='dinov3-b',
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

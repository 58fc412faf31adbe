# Mask R-CNN with a narrow ViT ("nano": 128 channels, 4 blocks, 4 heads, patch 16) and
# ViT-Adapter's interaction adapter (convolutional spatial prior, 2 interaction groups of 2
# blocks, deformable attention through mmcv's CPU path) on the generated shapes data, trained
# from scratch on a 2-core CPU. Heads, data and schedule are the shapes
# base's (_base_/mask_rcnn_shapes.py).
#   python tools/make_shapes.py            # data under data/shapes/ (once)
#   python tools/train.py configs/demo/mask_rcnn_vit_adapter_interaction_shapes.py
_base_ = './_base_/mask_rcnn_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch=dict(embed_dims=128, num_layers=4, num_heads=4, feedforward_channels=512),
        img_size=128,
        patch_size=16,
        with_cls_token=False,
        drop_path_rate=0.0,
        adapter='interaction',
        adapter_cfg=dict(
            interaction_indexes=[(0, 2), (2, 4)],
            num_heads=4,
            conv_inplane=32,
            n_points=4,
            deform_ratio=1.0,
            cffn_ratio=0.25,
            out_channels=64,
            norm_cfg=dict(type='BN')),
        init_cfg=None),
    neck=dict(in_channels=[64, 64, 64, 64]))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(num_layers=4, layer_decay_rate=0.9),
    clip_grad=dict(max_norm=10.0, norm_type=2))

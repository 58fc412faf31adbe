# Mask R-CNN with a narrow ViT ("nano": 128 channels, 4 blocks, 4 heads, patch 8) and ViTDet's
# simple feature pyramid on the generated shapes data, trained from scratch on a 2-core CPU.
# Everything but the backbone (heads, data, schedule) is the shapes base's
# (_base_/mask_rcnn_shapes.py). Window attention
# (window 8 on the 16 x 16 token grid of a 128 x 128 image) in blocks 0 and 2, decomposed
# relative positions, and the layer-decay optimiser (mild rate: there is no pretraining).

#   python tools/make_shapes.py            # data under data/shapes/ (once)
#   python tools/train.py configs/demo/mask_rcnn_vit_adapter_simple_shapes.py
_base_ = './_base_/mask_rcnn_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch=dict(embed_dims=128, num_layers=4, num_heads=4, feedforward_channels=512),
        img_size=128,
        patch_size=8,
        with_cls_token=False,
        window_size=8,
        global_attn_indexes=(1, 3),
        use_rel_pos=True,
        drop_path_rate=0.0,
        adapter='simple',
        adapter_cfg=dict(out_channels=64),
        init_cfg=None),
    neck=dict(in_channels=[64, 64, 64, 64]))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(num_layers=4, layer_decay_rate=0.9),
    clip_grad=dict(max_norm=10.0, norm_type=2))

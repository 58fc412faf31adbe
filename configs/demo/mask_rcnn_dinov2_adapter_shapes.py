# Mask R-CNN with a DINOv2-architecture ViT at demo width ("nano": 128 channels, 4 blocks,
# 4 heads) and ViT-Adapter's interaction adapter on the generated shapes data, trained from
# scratch on a 2-core CPU. The trunk has everything a DINOv2 checkpoint needs (patch 14, CLS
# token + 4 register tokens, LayerScale, final LayerNorm; docs/foundation_vits.md); only the
# widths are small and there is no pretraining (LayerScale starts at 0.1 instead of the
# released 1e-5, which would keep every block near the identity for most of a short run).
# Heads, data and schedule are the Swin demo's (mask_rcnn_swin_nano_shapes.py).
#   python tools/demo.py --config configs/demo/mask_rcnn_dinov2_adapter_shapes.py
_base_ = './mask_rcnn_swin_nano_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch=dict(embed_dims=128, num_layers=4, num_heads=4, feedforward_channels=512),
        patch_size=14,
        img_size=140,  # a 10 x 10 grid: the 128-px images (padded to 140) need no resize
        with_cls_token=True,
        num_register_tokens=4,
        layer_scale_init_value=0.1,
        final_norm=True,
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
    # LayerScale's gamma is 1-D (no decay already); the register tokens join the embeddings
    paramwise_cfg=dict(num_layers=4, layer_decay_rate=0.9,
                       no_weight_decay_names=['register_tokens']),
    clip_grad=dict(max_norm=10.0, norm_type=2))

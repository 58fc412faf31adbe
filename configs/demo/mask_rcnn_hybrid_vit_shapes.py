# Mask R-CNN with a narrow hybrid ResNetV2 + ViT ("nano": stem 32, CNN stages 2-2-2 of
# 128 / 256 / 512 channels with StdConv + GroupNorm, then a 4-block ViT of 128 channels, 4 heads
# on the stride-16 map) on the generated shapes data, trained from scratch on a 2-core CPU.
# Everything but the backbone, the optimiser's no-decay keys and its rate (heads, data,
# schedule) is the shapes base's (_base_/mask_rcnn_shapes.py). Pyramid: CNN stages 1-2 (128 / 256 channels, strides 4 / 8),
# the ViT output and its max-pool (128 channels, strides 16 / 32).
#   python tools/make_shapes.py            # data under data/shapes/ (once)
#   python tools/train.py configs/demo/mask_rcnn_hybrid_vit_shapes.py
#   python tools/demo.py --config configs/demo/mask_rcnn_hybrid_vit_shapes.py
_base_ = './_base_/mask_rcnn_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='HybridViT',
        arch=dict(embed_dims=128, num_layers=4, num_heads=4, feedforward_channels=512),
        img_size=128,  # pos-embed for the 8 x 8 token grid of a 128 x 128 image
        stem_channels=32,
        cnn_depths=(2, 2, 2),
        cnn_channels=(128, 256, 512),
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        out_channels=None,
        init_cfg=None),
    neck=dict(in_channels=[128, 256, 128, 128]))

optim_wrapper = dict(
    optimizer=dict(lr=1e-3),  # the rate its documented runs used (the base's is 2e-3)
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys=dict(pos_embed=dict(decay_mult=0.), cls_token=dict(decay_mult=0.))))

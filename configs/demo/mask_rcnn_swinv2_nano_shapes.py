# Mask R-CNN with a narrow Swin V2 ("nano": embed_dims=32, depths 2-2-2-2, window 8) on the
# generated shapes data: the shapes base (_base_/mask_rcnn_shapes.py: data, heads,
# schedule, AdamW lr 2e-3) with the Swin V2 backbone, trained from scratch on a 2-core CPU.
# `python tools/demo.py --config configs/demo/mask_rcnn_swinv2_nano_shapes.py` runs it.
_base_ = './_base_/mask_rcnn_shapes.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='SwinTransformerV2',
        embed_dims=32,
        depths=[2, 2, 2, 2],
        num_heads=[1, 2, 4, 8],
        window_size=8,
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=None))
# Swin V2's weight-decay exemptions (Microsoft's no_weight_decay_keywords) on top of the demo's
optim_wrapper = dict(paramwise_cfg=dict(custom_keys=dict(cpb_mlp=dict(decay_mult=0.),
                                                        logit_scale=dict(decay_mult=0.))))

# UPerNet with a narrow Swin ("nano": embed_dims=32, depths 2-2-2-2) on the ADE20K-style half of
# the generated shapes data: 5 classes (background + 4 shapes), trained from scratch on a 2-core
# CPU. `python tools/demo.py --seg` runs it. Data location: `tools/demo.py --data-root DIR`
# (MMEngine substitutes `data_root` only when the file is parsed, so a bare
# `--cfg-options data_root=...` does not reach the dataset entries).
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)
default_scope = 'mmseg'

data_root = 'data/shapes/'  # tools/make_shapes.py output; the ADE20K-style half is under ade/
image_size = (128, 128)  # (H, W) the data is generated at
num_classes = 5  # background, square, disc, triangle, star (ShapesSegDataset.METAINFO)
# mIoU by schedule length (docs/benchmarks.md): 3000 -> 38.8, 8000 -> 58.2, 16000 -> 78.9 and 74.7
# (two runs; 71.5 at iteration 8000 of the first). About 34 CPU-minutes, 22 min on 2 cores.
max_iters = 16000
val_interval = max_iters

norm_cfg = dict(type='BN', requires_grad=True)  # single process on CPU: BN, not SyncBN
model = dict(
    type='EncoderDecoder',
    data_preprocessor=dict(
        type='SegDataPreProcessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_val=0,
        seg_pad_val=255,
        size=image_size),
    backbone=dict(
        type='SwinTransformer',
        embed_dims=32,
        depths=[2, 2, 2, 2],
        num_heads=[1, 2, 4, 8],
        window_size=8,
        mlp_ratio=4,
        qkv_bias=True,
        drop_path_rate=0.0,
        patch_norm=True,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    decode_head=dict(
        type='UPerHead',
        in_channels=[32, 64, 128, 256],
        in_index=[0, 1, 2, 3],
        pool_scales=(1, 2, 3, 6),
        channels=64,
        dropout_ratio=0.1,
        num_classes=num_classes,
        norm_cfg=norm_cfg,
        align_corners=False,
        # Background is ~88% of the pixels; down-weighting it stops a from-scratch model from
        # settling on "all background" for hundreds of iterations. mmseg 1.2.2's loss cannot
        # combine class_weight with ignored (255) pixels, so the training images are used at
        # their generated size, unpadded; drop class_weight if you pad or crop.
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0,
                         class_weight=[0.25, 1.0, 1.0, 1.0, 1.0])),
    auxiliary_head=dict(
        type='FCNHead',
        in_channels=128,
        in_index=2,
        channels=32,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=num_classes,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4,
                         class_weight=[0.25, 1.0, 1.0, 1.0, 1.0])),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type='ShapesSegDataset',
        data_root=data_root + 'ade/',
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='ShapesSegDataset',
        data_root=data_root + 'ade/',
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=val_interval)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys=dict(
            relative_position_bias_table=dict(decay_mult=0.),
            absolute_pos_embed=dict(decay_mult=0.))))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(type='PolyLR', power=1.0, eta_min=1e-5, by_epoch=False, begin=100, end=max_iters),
]

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='mmvitswin.AtomicCheckpointHook', interval=max_iters, by_epoch=False,
                    max_keep_ckpts=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
# A NaN/Inf loss stops the run at once, naming the iteration (docs/reliability.md)
custom_hooks = [dict(type='mmvitswin.FiniteLossHook', interval=1)]
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='gloo'))
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(type='LogProcessor', window_size=25, by_epoch=False)
log_level = 'INFO'
# weights-only --resume/load_from, atomic checkpoint files (docs/reliability.md)
runner_type = 'mmvitswin.SafeCheckpointRunner'
load_from = None
resume = False
randomness = dict(seed=0)

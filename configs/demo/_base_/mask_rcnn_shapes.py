# Mask R-CNN on the generated shapes data with a narrow Swin ("nano": embed_dims=32, depths
# 2-2-2-2): the shared base of the shapes demos (the ViT, hybrid and Swin V2 demos replace the
# backbone; their documented runs used this file as it is). `make demo` trains
# ../mask_rcnn_swin_nano_shapes.py, which adds a recipe that learns the same on every seed.
# tools/make_shapes.py makes the data.
# Data location: `tools/demo.py --data-root DIR` rewrites every path derived from `data_root`
# (MMEngine substitutes a top-level variable only when the file is parsed, so a bare
# `--cfg-options data_root=...` does not reach the dataset entries).
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)
default_scope = 'mmdet'

data_root = 'data/shapes/'  # tools/make_shapes.py output; the COCO half is under coco/
classes = ('square', 'disc', 'triangle', 'star')
image_size = (128, 128)  # (H, W) the data is generated at; also the train/test scale
max_iters = 2000
val_interval = max_iters  # evaluate once, at the end

model = dict(
    type='MaskRCNN',
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_mask=True,
        pad_size_divisor=32),
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
    neck=dict(type='FPN', in_channels=[32, 64, 128, 256], out_channels=64, num_outs=5),
    rpn_head=dict(
        type='RPNHead',
        in_channels=64,
        feat_channels=64,
        # Shapes are 8..80 px: anchors of 16..256 px (scale 4 at strides 4..64).
        anchor_generator=dict(
            type='AnchorGenerator', scales=[4], ratios=[0.5, 1.0, 2.0],
            strides=[4, 8, 16, 32, 64]),
        bbox_coder=dict(
            type='DeltaXYWHBBoxCoder', target_means=[.0, .0, .0, .0],
            target_stds=[1.0, 1.0, 1.0, 1.0]),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=True, loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
    roi_head=dict(
        type='StandardRoIHead',
        # mmcv's RoIAlign values, computed as matrix products: its CPU backward was a third of
        # the iteration
        bbox_roi_extractor=dict(
            type='SeparableRoIExtractor',
            roi_layer=dict(type='SeparableRoIAlign', output_size=7, sampling_ratio=0),
            out_channels=64,
            featmap_strides=[4, 8, 16, 32]),
        bbox_head=dict(
            type='Shared2FCBBoxHead',
            in_channels=64,
            fc_out_channels=256,
            roi_feat_size=7,
            num_classes=len(classes),
            bbox_coder=dict(
                type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                target_stds=[0.1, 0.1, 0.2, 0.2]),
            reg_class_agnostic=False,
            loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
            loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
        mask_roi_extractor=dict(
            type='SeparableRoIExtractor',
            roi_layer=dict(type='SeparableRoIAlign', output_size=14, sampling_ratio=0),
            out_channels=64,
            featmap_strides=[4, 8, 16, 32]),
        # FCNMaskHead's values in channels-last memory (its bf16 backward was the slowest kernel)
        mask_head=dict(
            type='ChannelsLastFCNMaskHead',
            num_convs=2,
            in_channels=64,
            conv_out_channels=64,
            num_classes=len(classes),
            loss_mask=dict(type='CrossEntropyLoss', use_mask=True, loss_weight=1.0))),
    train_cfg=dict(
        rpn=dict(
            assigner=dict(
                type='MaxIoUAssigner', pos_iou_thr=0.7, neg_iou_thr=0.3, min_pos_iou=0.3,
                match_low_quality=True, ignore_iof_thr=-1),
            sampler=dict(
                type='RandomSampler', num=128, pos_fraction=0.5, neg_pos_ub=-1,
                add_gt_as_proposals=False),
            allowed_border=-1,
            pos_weight=-1,
            debug=False),
        # 300 boxes per level into NMS (the stride-4 level has 3072 anchors at 128 px): a
        # tenth off the iteration, box mAP 0.593 against 0.569 with 500
        rpn_proposal=dict(
            nms_pre=300, max_per_img=300, nms=dict(type='nms', iou_threshold=0.7),
            min_bbox_size=0),
        rcnn=dict(
            assigner=dict(
                type='MaxIoUAssigner', pos_iou_thr=0.5, neg_iou_thr=0.5, min_pos_iou=0.5,
                match_low_quality=True, ignore_iof_thr=-1),
            sampler=dict(
                type='RandomSampler', num=128, pos_fraction=0.25, neg_pos_ub=-1,
                add_gt_as_proposals=True),
            mask_size=28,
            pos_weight=-1,
            debug=False)),
    test_cfg=dict(
        rpn=dict(
            nms_pre=500, max_per_img=100, nms=dict(type='nms', iou_threshold=0.7),
            min_bbox_size=0),
        rcnn=dict(
            score_thr=0.05, nms=dict(type='nms', iou_threshold=0.5), max_per_img=30,
            mask_thr_binary=0.5)))

backend_args = None
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
# Loading in the main process: a 128 px batch takes about 9 ms there, and a worker process on
# two cores made the iteration slower (0.21-0.25 s against 0.27-0.31 s early in training,
# alternating runs)
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(
        type='CocoDataset',
        data_root=data_root + 'coco/',
        metainfo=dict(classes=classes),
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=4),
        pipeline=train_pipeline,
        backend_args=backend_args))
val_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='CocoDataset',
        data_root=data_root + 'coco/',
        metainfo=dict(classes=classes),
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        test_mode=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader
val_evaluator = dict(
    type='CocoMetric',
    ann_file=data_root + 'coco/annotations/instances_val.json',
    metric=['bbox', 'segm'],
    format_only=False,
    backend_args=backend_args)
test_evaluator = val_evaluator

train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=val_interval)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

# lr 2e-3: box mAP 0.569 against 0.528 with 1e-3, same code and nms_pre.
# GroupedOptimWrapperConstructor: mmengine's per-parameter settings in 3 param groups instead
# of 163, and torch's fused AdamW where it has one for CPU (torch >= 2.4): the AdamW step
# 19 -> 3.7 ms, the iteration 353 -> 325 ms.
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='GroupedOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999), weight_decay=0.05,
                   fused='auto'),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys=dict(
            relative_position_bias_table=dict(decay_mult=0.),
            absolute_pos_embed=dict(decay_mult=0.))),
    clip_grad=dict(max_norm=10.0, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=100, end=max_iters, eta_min=1e-5),
]

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='mmvitswin.AtomicCheckpointHook', interval=max_iters, by_epoch=False,
                    max_keep_ckpts=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='DetVisualizationHook'))
# A NaN/Inf loss stops the run at once, naming the iteration (docs/reliability.md)
custom_hooks = [dict(type='mmvitswin.FiniteLossHook', interval=1)]
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='gloo'))
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(type='LogProcessor', window_size=25, by_epoch=False)
log_level = 'INFO'
# weights-only --resume/load_from, atomic checkpoint files (docs/reliability.md)
runner_type = 'mmvitswin.SafeCheckpointRunner'
load_from = None
resume = False
randomness = dict(seed=0)

# UPerNet on a frozen DINOv3-7B trunk with ViTDet's simple feature pyramid, ADE20K, 512x512
# crops, 160k iterations, trained with FSDP2 on MMEngine's FlexibleRunner (the frozen-trunk
# recipe and the sharding of mask_rcnn_dinov3_7b_simple_fsdp2_coco.py).
#   tools/dist_train.sh configs/upernet_dinov3_7b_simple_fsdp2_ade20k.py 8
_base_ = './upernet_vit_adapter_dinov3_b_simple_ade20k.py'

pretrained = 'checkpoints/dinov3-vit7b16-pretrain-lvd1689m'
model = dict(
    backbone=dict(
        arch='dinov3-7b',
        frozen_stages=40,
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)))

runner_type = 'FlexibleRunner'
strategy = dict(
    type='mmvitswin.FSDP2Strategy',
    mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32'),
    meta_init=True)  # blocks built empty, each process reads its shards of the checkpoint
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='GroupedOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.),
    clip_grad=dict(max_norm=1.0, norm_type=2))

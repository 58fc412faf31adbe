# Mask R-CNN on a frozen DINOv3-7B trunk (arch='dinov3-7b': 4096 wide, 40 blocks, SwiGLU, no
# q/k/v bias, 2-D RoPE) with ViTDet's simple feature pyramid, FPN, COCO 2017, 1x, trained with
# FSDP2 on MMEngine's FlexibleRunner: Meta's downstream recipe keeps the 7B frozen and trains
# what sits on it. The frozen trunk runs without autograd (no activations kept); each block is
# an FSDP unit gathered in bf16 just before it runs, so a process holds 1/N of the 27 GB of
# fp32 weights, and reads only its 1/N from the checkpoint (meta_init). Only the pyramid, FPN
# and heads train (AdamW, fp32 master weights).
#   tools/dist_train.sh configs/mask_rcnn_dinov3_7b_simple_fsdp2_coco.py 8
# Memory per GPU: docs/fsdp.md. Sharded checkpoints: iter/epoch_N.pth are directories;
# tools/convert_checkpoint.py ITER_DIR OUT_FILE makes a single file for tools/test.py.
_base_ = './mask_rcnn_vit_adapter_dinov3_b_simple_coco_1x.py'

# gated weights; the HF snapshot directory (its safetensors shards), Meta's or timm's file
pretrained = 'checkpoints/dinov3-vit7b16-pretrain-lvd1689m'
model = dict(
    backbone=dict(
        arch='dinov3-7b',
        frozen_stages=40,  # the embedding, every block and the final norm
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)))

runner_type = 'FlexibleRunner'
strategy = dict(
    type='mmvitswin.FSDP2Strategy',
    mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32'),
    meta_init=True)  # blocks built empty, each process reads its shards of the checkpoint
# nothing of the trunk trains: one param group per setting, no layer-wise decay
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='GroupedOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(norm_decay_mult=0.),
    clip_grad=dict(max_norm=1.0, norm_type=2))

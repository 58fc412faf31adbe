# Mask R-CNN, DINOv3 ViT-L/16 + ViT-Adapter (interaction mode, 4 groups of 6 blocks), FPN,
# COCO 2017, 1x, fine-tuned end to end with FSDP2 on MMEngine's FlexibleRunner: each trunk block
# and each injector/extractor is an FSDP unit (the blocks gathered in bf16, gradients reduced
# in fp32), every block under activation checkpointing. ViT-Adapter-L's recipe: AdamW lr 1e-4
# wd 0.05, layer-wise lr decay 0.8, drop path 0.4.
#   tools/dist_train.sh configs/mask_rcnn_vit_adapter_dinov3_l_fsdp2_coco.py 8
_base_ = './mask_rcnn_vit_adapter_dinov3_b_coco_1x.py'

pretrained = 'checkpoints/dinov3-vitl16-pretrain-lvd1689m'  # HF snapshot dir (gated)
model = dict(
    backbone=dict(
        arch='dinov3-l',
        drop_path_rate=0.4,
        with_cp=True,
        adapter_cfg=dict(interaction_indexes=[(0, 6), (6, 12), (12, 18), (18, 24)],
                         num_heads=16),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[1024, 1024, 1024, 1024]))

runner_type = 'FlexibleRunner'
strategy = dict(
    type='mmvitswin.FSDP2Strategy',
    mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32'),
    meta_init=True)  # blocks built empty, each process reads its shards of the checkpoint
optim_wrapper = dict(paramwise_cfg=dict(num_layers=24, layer_decay_rate=0.8))

# Mask R-CNN, DINOv2 ViT-g/14 (1536 wide, 40 blocks, SwiGLU) + ViT-Adapter (interaction mode,
# 4 groups of 10 blocks), FPN, COCO 2017, 1x, fine-tuned end to end with FSDP2 on MMEngine's
# FlexibleRunner (units, precision and checkpointing as mask_rcnn_vit_adapter_dinov3_l_fsdp2_coco.py):
# 1.1 B trunk parameters, whose fp32 weights, gradients and AdamW states (18 GB) do not fit
# beside the activations in one GPU as a DDP replica. Window attention (14) in all blocks but
# the last of each group, as the B config; layer-wise lr decay 0.9, drop path 0.4.
#   tools/dist_train.sh configs/mask_rcnn_vit_adapter_dinov2_g_fsdp2_coco.py 8
_base_ = './mask_rcnn_vit_adapter_dinov2_b_coco_1x.py'

pretrained = 'checkpoints/dinov2_vitg14_pretrain.pth'  # Meta's file (or HF/timm)
model = dict(
    backbone=dict(
        arch='dinov2-g',
        drop_path_rate=0.4,
        with_cp=True,
        global_attn_indexes=(9, 19, 29, 39),
        adapter_cfg=dict(interaction_indexes=[(0, 10), (10, 20), (20, 30), (30, 40)],
                         num_heads=24),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[1536, 1536, 1536, 1536]))

runner_type = 'FlexibleRunner'
strategy = dict(
    type='mmvitswin.FSDP2Strategy',
    mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32'),
    meta_init=True)  # blocks built empty, each process reads its shards of the checkpoint
optim_wrapper = dict(paramwise_cfg=dict(num_layers=40, layer_decay_rate=0.9))

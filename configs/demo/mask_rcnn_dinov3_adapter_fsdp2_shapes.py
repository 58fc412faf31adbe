# Mask R-CNN with a DINOv3-7B-structured ViT at demo width (128 channels, 4 blocks, 4 heads,
# patch 16, CLS + 4 registers, 2-D RoPE, LayerScale, SwiGLU, no q/k/v bias, final LayerNorm)
# and ViT-Adapter's interaction adapter, trained with FSDP2 on MMEngine's FlexibleRunner: the
# structure of ../mask_rcnn_vit_adapter_dinov3_l_fsdp2_coco.py at a size two CPU processes
# train on the generated shapes data. Each ViT block and each injector/extractor is an FSDP unit;
# checkpoints are sharded directories (docs/fsdp.md).
#   python tools/make_shapes.py            # data under data/shapes/ (once)
#   tools/dist_train.sh configs/demo/mask_rcnn_dinov3_adapter_fsdp2_shapes.py 2
_base_ = './mask_rcnn_vit_adapter_interaction_shapes.py'

model = dict(
    backbone=dict(
        arch=dict(embed_dims=128, num_layers=4, num_heads=4, feedforward_channels=256,
                  ffn_type='swiglu'),
        patch_size=16,
        with_cls_token=True,
        num_register_tokens=4,
        layer_scale_init_value=0.1,  # the released 1e-5 would keep a short run near identity
        rope_theta=100.0,
        abs_pos_embed=False,
        qkv_bias=False,
        final_norm=True,
        norm_cfg=dict(type='LN', eps=1e-5),
        with_cp=True))

runner_type = 'FlexibleRunner'
strategy = dict(
    type='mmvitswin.FSDP2Strategy',
    # the trunk's blocks gathered in bf16, gradients reduced in fp32; the rest in fp32
    mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32'))
default_hooks = dict(checkpoint=dict(interval=500, max_keep_ckpts=2))
optim_wrapper = dict(paramwise_cfg=dict(no_weight_decay_names=['register_tokens']))

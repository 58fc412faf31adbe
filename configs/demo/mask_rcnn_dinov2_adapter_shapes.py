# Mask R-CNN with a DINOv2-architecture ViT at demo width ("nano": 128 channels, 4 blocks,
# 4 heads) and ViT-Adapter's interaction adapter on the generated shapes data, trained from
# scratch on a 2-core CPU: the interaction-adapter demo (its adapter, heads, data, schedule and
# layer-decay optimiser) with the trunk DINOv2's. The trunk has everything a DINOv2 checkpoint
# needs (patch 14, CLS token + 4 register tokens, LayerScale, final LayerNorm;
# docs/foundation_vits.md); only the widths are small and there is no pretraining (LayerScale
# starts at 0.1 instead of the released 1e-5, which would keep every block near the identity
# for most of a short run).
#   python tools/demo.py --config configs/demo/mask_rcnn_dinov2_adapter_shapes.py
_base_ = './mask_rcnn_vit_adapter_interaction_shapes.py'

model = dict(
    backbone=dict(
        patch_size=14,
        img_size=140,  # a 10 x 10 grid: the 128-px images (padded to 140) need no resize
        with_cls_token=True,
        num_register_tokens=4,
        layer_scale_init_value=0.1,
        final_norm=True))

# LayerScale's gamma is 1-D (no decay already); the register tokens join the embeddings
optim_wrapper = dict(paramwise_cfg=dict(no_weight_decay_names=['register_tokens']))

# Mask R-CNN, DINOv2 ViT-B/14 + ViT-Adapter (interaction mode: spatial prior module and
# injector/extractor deformable cross-attention around 4 groups of 3 blocks), FPN, COCO 2017,
# 3x (36 epochs) with multi-scale + crop training. ViT-Adapter-B's recipe: AdamW lr 1e-4
# wd 0.05, layer-wise lr decay 0.65, drop path 0.3, window attention (14) in all blocks but
# 2, 5, 8, 11. The trunk is DINOv2's (arch='dinov2-b': patch 14 at 518 px, CLS token,
# LayerScale, final LayerNorm; HF's plain-bicubic pos-embed resize at run time). The stride-14
# token grid is placed by stride in the image, so the pyramid is at strides 4/8/16/32 for any
# input size (docs/foundation_vits.md).
_base_ = './mask_rcnn_vit_adapter_b_coco.py'

# Download once (`huggingface-cli download facebook/dinov2-base --local-dir
# checkpoints/dinov2-base`); Meta's dinov2_vitb14_pretrain.pth or timm's
# vit_base_patch14_dinov2.lvd142m file load the same way: the format is detected and the
# architecture (width, depth, heads, LayerScale, registers, FFN) checked on load.
pretrained = 'checkpoints/dinov2-base'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='dinov2-b',
        drop_path_rate=0.3,
        window_size=14,
        global_attn_indexes=(2, 5, 8, 11),
        adapter='interaction',
        adapter_cfg=dict(
            interaction_indexes=[(0, 3), (3, 6), (6, 9), (9, 12)],
            num_heads=12,
            conv_inplane=64,
            n_points=4,
            deform_ratio=0.5,
            cffn_ratio=0.25,
            init_values=0.,
            norm_cfg=dict(type='SyncBN')),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[768, 768, 768, 768]))

optim_wrapper = dict(
    optimizer=dict(lr=0.0001, weight_decay=0.05),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.65))

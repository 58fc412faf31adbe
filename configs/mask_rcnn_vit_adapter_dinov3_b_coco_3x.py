# Mask R-CNN, DINOv3 ViT-B/16 + ViT-Adapter (interaction mode: spatial prior module and
# injector/extractor deformable cross-attention around 4 groups of 3 blocks), FPN, COCO 2017,
# 3x (36 epochs) with multi-scale + crop training. ViT-Adapter-B's recipe: AdamW lr 1e-4
# wd 0.05, layer-wise lr decay 0.65, drop path 0.3. The trunk is DINOv3's (arch='dinov3-b':
# CLS + 4 register tokens, LayerScale, 2-D RoPE on every block, no absolute position
# embedding, LayerNorm eps 1e-5): all blocks global, as DINOv3 was trained (the RoPE covers
# any input size, so nothing is resized at run time).
_base_ = './mask_rcnn_vit_adapter_b_coco.py'

# DINOv3's weights are gated (license acceptance); download once, then point here to the HF
# snapshot directory (`huggingface-cli download facebook/dinov3-vitb16-pretrain-lvd1689m
# --local-dir checkpoints/dinov3-vitb16-pretrain-lvd1689m`), Meta's
# dinov3_vitb16_pretrain_lvd1689m-*.pth or timm's vit_base_patch16_dinov3.lvd1689m file:
# the format is detected and the architecture checked on load.
pretrained = 'checkpoints/dinov3-vitb16-pretrain-lvd1689m'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='dinov3-b',
        drop_path_rate=0.3,
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

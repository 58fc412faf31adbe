# Mask R-CNN, DINOv2 ViT-B/14 + ViTDet's simple feature pyramid, FPN, COCO 2017, 3x. ViTDet-B's
# recipe: window attention (14) in all blocks but 2, 5, 8, 11, AdamW lr 1e-4 wd 0.1, layer-wise
# lr decay 0.7, drop path 0.1. The last block's stride-14 map is resampled bilinearly to stride
# 16 (by position in the image) before the pyramid's deconvolutions and pooling.
_base_ = './mask_rcnn_vit_adapter_dinov2_b_coco_3x.py'

pretrained = 'checkpoints/dinov2-base'  # HF snapshot dir, Meta .pth or timm file
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='dinov2-b',
        drop_path_rate=0.1,
        window_size=14,
        global_attn_indexes=(2, 5, 8, 11),
        adapter='simple',
        adapter_cfg=dict(out_channels=256),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[256, 256, 256, 256]))

optim_wrapper = dict(
    optimizer=dict(weight_decay=0.1),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.7))

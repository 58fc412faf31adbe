# Mask R-CNN, DINOv3 ViT-B/16 with ViTDet's simple feature pyramid (adapter='simple':
# deconvolutions x4 and x2, identity, max-pool, 256 channels), FPN, COCO 2017, 3x (36 epochs)
# with multi-scale + crop training. ViTDet-B's recipe: AdamW lr 1e-4 wd 0.1, layer-wise lr
# decay 0.7, drop path 0.1. The trunk is DINOv3's (arch='dinov3-b'), all blocks global with
# the 2-D RoPE, as pretrained; see mask_rcnn_vit_adapter_dinov3_b_coco_3x.py for the weights.
_base_ = './mask_rcnn_vit_adapter_dinov3_b_coco_3x.py'

pretrained = 'checkpoints/dinov3-vitb16-pretrain-lvd1689m'  # HF snapshot dir (gated)
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='dinov3-b',
        drop_path_rate=0.1,
        adapter='simple',
        adapter_cfg=dict(out_channels=256),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[256, 256, 256, 256]))

optim_wrapper = dict(
    optimizer=dict(weight_decay=0.1),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.7))

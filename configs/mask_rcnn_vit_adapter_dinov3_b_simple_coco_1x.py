# Mask R-CNN, DINOv3 ViT-B/16 with ViTDet's simple feature pyramid, FPN, COCO 2017, 1x
# (12 epochs, lr x0.1 at epochs 8 and 11); otherwise the simple 3x config (ViTDet-B recipe:
# AdamW lr 1e-4 wd 0.1, layer-wise lr decay 0.7, drop path 0.1).
_base_ = './mask_rcnn_vit_adapter_dinov3_b_simple_coco_3x.py'

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1)
]

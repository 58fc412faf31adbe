# Mask R-CNN, DINOv2 ViT-B/14 + ViT-Adapter (interaction), FPN, COCO 2017, 1x (12 epochs):
# mask_rcnn_vit_adapter_dinov2_b_coco_3x.py with the 1x schedule (steps at 8 and 11).
_base_ = './mask_rcnn_vit_adapter_dinov2_b_coco_3x.py'

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1)
]

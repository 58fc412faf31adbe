# Mask R-CNN, Swin V2-S (window 16), FPN, COCO 2017, 3x: the Swin V2-T config with the small
# preset, its 256-px window-16 checkpoint and drop path 0.3 (the Swin S detection recipe's).
_base_ = './mask_rcnn_swinv2_t_coco_3x.py'
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v2.0.0/swinv2_small_patch4_window16_256.pth'  # noqa: E501
model = dict(
    backbone=dict(arch='small', drop_path_rate=0.3,
                  init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

# Mask R-CNN, Swin V2-T (window 16), FPN, COCO 2017, 1x (12 epochs): the Swin detection recipe
# of mask_rcnn_swin_t_coco.py (multi-scale 480-800 + DETR crop branch, AdamW lr 1e-4, wd 0.05,
# batch 16); backbone and weight-decay exemptions: _base_/swinv2.py.
_base_ = ['./_base_/models/mask_rcnn_swin_fpn.py', './_base_/datasets/coco_instance_ms_crop.py',
          './_base_/schedules/schedule_1x.py', './_base_/det_runtime.py', './_base_/swinv2.py']
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)
model = dict(backbone={{_base_.swinv2_backbone}}, neck=dict(in_channels=[96, 192, 384, 768]))
optim_wrapper = {{_base_.swinv2_optim_wrapper}}

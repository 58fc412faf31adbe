# Mask R-CNN, Swin V2-T (window 16), FPN, COCO 2017, 3x (36 epochs): the 3x schedule (lr x0.1 at
# epochs 27 and 33) with the backbone of _base_/swinv2.py.
_base_ = ['./_base_/models/mask_rcnn_swin_fpn.py', './_base_/datasets/coco_instance_ms_crop.py',
          './_base_/schedules/schedule_3x.py', './_base_/det_runtime.py', './_base_/swinv2.py']
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)
model = dict(backbone={{_base_.swinv2_backbone}}, neck=dict(in_channels=[96, 192, 384, 768]))
optim_wrapper = {{_base_.swinv2_optim_wrapper}}

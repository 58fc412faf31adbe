# UPerNet, Swin V2-T (window 16), ADE20K, 512x512 crops, 160k iterations: the Swin segmentation
# recipe of upernet_swin_t_ade20k.py (AdamW lr 6e-5, wd 0.01, poly decay, batch 16, drop path
# 0.3); backbone and weight-decay exemptions: _base_/swinv2.py.
_base_ = [
    './_base_/models/upernet_swin.py',
    './_base_/datasets/ade20k.py',
    './_base_/schedules/schedule_160k.py',
    './_base_/seg_runtime.py',
    './_base_/swinv2.py',
]
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)
crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone={{_base_.swinv2_seg_backbone}},
    decode_head=dict(in_channels=[96, 192, 384, 768], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150))
optim_wrapper = {{_base_.swinv2_optim_wrapper}}

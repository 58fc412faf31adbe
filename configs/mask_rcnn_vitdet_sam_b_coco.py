# Mask R-CNN, SAM-B image encoder as a ViTDet backbone (simple feature pyramid: deconvolutions
# x4 and x2, identity, max-pool, 256 channels), FPN, COCO 2017, 3x (36 epochs) with
# multi-scale + crop training. The trunk is SAM's (arch='sam-b': ViT-B/16 at 1024 px, windows
# of 14 with global blocks 2, 5, 8, 11, decomposed relative positions, no CLS token); the
# ViTDet-B recipe on top: drop path 0.1, AdamW lr 1e-4 wd 0.1, layer-wise lr decay 0.7.
# SAM's conv neck is not used (neck=None): its keys, like the prompt encoder's and the mask
# decoder's, are not loaded. The position grid (64 x 64) is resized to every input
# bicubically, as ViTDet does.
_base_ = './mask_rcnn_vit_adapter_b_simple_coco.py'

# Meta's whole-SAM release (image_encoder.* is taken); HF's facebook/sam-vit-base snapshot
# directory or timm's samvit_base_patch16.sa1b file load the same way (detected on load).
pretrained = 'https://dl.fbaipublicfiles.com/segment_anything/sam_vit_b_01ec64.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='sam-b',
        drop_path_rate=0.1,
        adapter='simple',
        adapter_cfg=dict(out_channels=256),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[256, 256, 256, 256]))

optim_wrapper = dict(
    optimizer=dict(lr=0.0001, weight_decay=0.1),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.7))

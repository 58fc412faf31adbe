# Mask R-CNN, ViT-B with ViTDet's simple feature pyramid (adapter='simple': deconvolutions x4
# and x2, identity, max-pool, LayerNorm-2d, 256 channels), FPN, COCO 2017, 3x (36 epochs).
# ViTDet-B backbone recipe (MAE init): window attention (14) with global blocks 2, 5, 8, 11,
# decomposed relative positions, drop path 0.1, AdamW lr 1e-4 wd 0.1, layer-wise lr decay 0.7.
# The FPN on top of the pyramid adds the stride-64 level the RPN uses.
_base_ = './mask_rcnn_vit_adapter_b_coco.py'

pretrained = 'https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViTAdapter',
        arch='base',
        img_size=224,
        drop_path_rate=0.1,
        with_cls_token=False,
        window_size=14,
        global_attn_indexes=(2, 5, 8, 11),
        use_rel_pos=True,
        adapter='simple',
        adapter_cfg=dict(out_channels=256),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[256, 256, 256, 256]))

optim_wrapper = dict(
    optimizer=dict(weight_decay=0.1),
    paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.7))

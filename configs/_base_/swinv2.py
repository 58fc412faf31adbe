# The Swin V2 backbone of configs/*swinv2* and its optimiser settings, in one place.
#
# Backbone: Swin V2-T at window 16 from Microsoft's ImageNet-1K release trained at 256 px with
# window 16 (format detected on load: a timm/HF/mmpretrain copy of the same weights works too).
# At 256 px the release's last stage (an 8x8 map) ran at window 8, so that stage's position-bias
# coordinates were normalised to 8: pretrained_window_sizes says so, and every stage runs at
# window 16 (loading refuses a setting that does not match the file's saved coordinates).
# The S/B configs change arch and checkpoint; drop path: 0.2 (T) / 0.3 (S, B) for detection, 0.3
# for segmentation, as the Swin recipes.
swinv2_backbone = dict(
    _delete_=True,  # replaces the V1 backbone of the model bases
    type='SwinTransformerV2',
    arch='tiny',
    window_size=16,
    pretrained_window_sizes=(16, 16, 16, 8),
    drop_path_rate=0.2,
    out_indices=(0, 1, 2, 3),
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint='https://github.com/SwinTransformer/storage/releases/download/v2.0.0/swinv2_tiny_patch4_window16_256.pth'))  # noqa: E501
swinv2_seg_backbone = dict(swinv2_backbone, drop_path_rate=0.3)
# No Swin V2-T/S/B detection or segmentation recipe is published: the configs keep the Swin
# recipes' optimisers and exempt from weight decay what Microsoft's Swin V2 code exempts
# (no_weight_decay_keywords: cpb_mlp, logit_scale), plus norms and biases (q_bias, v_bias).
swinv2_paramwise_cfg = dict(
    _delete_=True,
    norm_decay_mult=0.,
    bias_decay_mult=0.,
    custom_keys={
        'cpb_mlp': dict(decay_mult=0.),
        'logit_scale': dict(decay_mult=0.),
        'q_bias': dict(decay_mult=0.),
        'v_bias': dict(decay_mult=0.),
    })
# Built by GroupedOptimWrapperConstructor: the per-parameter settings mmengine's default gives
# for this paramwise_cfg, in a few param groups instead of one per tensor, and torch's fused
# AdamW where it has one (CPU from torch 2.4, CUDA): the SwinV2-T AdamW step took 20 ms
# against 58-69 ms unfused on 2 CPU cores.
swinv2_optim_wrapper = dict(
    constructor='GroupedOptimWrapperConstructor',
    optimizer=dict(fused='auto'),
    paramwise_cfg=swinv2_paramwise_cfg)

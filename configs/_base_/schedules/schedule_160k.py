# 160k iterations, the official Swin segmentation optimiser: AdamW lr 6e-5 (16 images per step),
# wd 0.01, no weight decay on position tables/embeddings and norms; 1500-iter linear warm-up,
# then poly (power 1) decay to 0.
max_iters = 160000
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=16000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=max_iters, by_epoch=False)
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.)
        }))
auto_scale_lr = dict(enable=False, base_batch_size=16)

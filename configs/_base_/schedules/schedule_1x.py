# 12 epochs, the official Swin detection optimiser: AdamW lr 1e-4 (16 images per step),
# wd 0.05, no weight decay on position tables/embeddings and norms; 1000-iter linear warm-up,
# lr x0.1 at epochs 8 and 11.
max_epochs = 12
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1)
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.)
        }))
# lr above is for 16 images per step; `--auto-scale-lr` rescales it to the actual batch
auto_scale_lr = dict(enable=False, base_batch_size=16)

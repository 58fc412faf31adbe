# MMDetection runtime: the mmdet scope decides which registries the Runner builds from.
_base_ = './default_runtime.py'
default_scope = 'mmdet'

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='mmvitswin.AtomicCheckpointHook', interval=1, max_keep_ckpts=3),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='DetVisualizationHook'))
# A NaN/Inf loss stops the run at once, naming the iteration (docs/reliability.md)
custom_hooks = [dict(type='mmvitswin.FiniteLossHook', interval=1)]
visualizer = dict(
    type='DetLocalVisualizer', vis_backends=[dict(type='LocalVisBackend')], name='visualizer')
log_processor = dict(type='LogProcessor', window_size=50, by_epoch=True)

# MMSegmentation runtime: the mmseg scope decides which registries the Runner builds from.
_base_ = './default_runtime.py'
default_scope = 'mmseg'

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='mmvitswin.AtomicCheckpointHook', by_epoch=False, interval=16000,
                    max_keep_ckpts=3),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
# A NaN/Inf loss stops the run at once, naming the iteration (mmseg ships no such check;
# docs/reliability.md)
custom_hooks = [dict(type='mmvitswin.FiniteLossHook', interval=1)]
visualizer = dict(
    type='SegLocalVisualizer', vis_backends=[dict(type='LocalVisBackend')], name='visualizer')
log_processor = dict(by_epoch=False)
tta_model = dict(type='SegTTAModel')

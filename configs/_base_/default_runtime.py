# Runtime settings shared by every mmvitswin config (detection and segmentation).
# Importing mmvitswin registers our backbones and bridges them into mmdet's and mmseg's
# registries, so `type='SwinTransformer'` below builds mmvitswin's class in either scope.
custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    # tools/train.py switches to gloo when no CUDA device is present.
    dist_cfg=dict(backend='nccl'),
)
log_level = 'INFO'
# MMEngine's Runner with weights-only --resume/load_from (torch >= 2.6), atomic checkpoint files
# and a resume that skips a half-written checkpoint (docs/reliability.md)
runner_type = 'mmvitswin.SafeCheckpointRunner'
load_from = None
resume = False

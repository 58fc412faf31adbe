"""mmvitswin's OpenMMLab layer: registries, registered backbones and heads, engine pieces,
datasets. Importing it registers our modules (and bridges them into mmdet's / mmseg's
registries, see :mod:`.registry`) and does nothing else: what our configs and tools need beyond
that (safe runner checkpoints, atomic saving, the loss check, CPU bf16) are components they
name, e.g. ``runner_type='mmvitswin.SafeCheckpointRunner'``."""
from . import datasets, engine, models  # noqa: F401  (registers every module)
from .registry import (DATASETS, HOOKS, LOOPS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS,
                       OPTIM_WRAPPERS, RUNNERS, STRATEGIES, bridge_to_hosts)

bridge_to_hosts()

__all__ = ['MODELS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'OPTIM_WRAPPERS', 'DATASETS', 'HOOKS',
           'LOOPS', 'RUNNERS', 'STRATEGIES', 'bridge_to_hosts']

"""mmvitswin's OpenMMLab layer: registries, registered backbones and heads, engine pieces,
datasets. Importing it registers our modules (and bridges them into mmdet's / mmseg's
registries, see :mod:`.registry`)."""
from . import datasets, engine, models  # noqa: F401  (registers every module)
from .registry import (DATASETS, HOOKS, LOOPS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS,
                       OPTIM_WRAPPERS, bridge_to_hosts)

bridge_to_hosts()

from .engine.safe_load import install_safe_loading  # noqa: E402
from .engine.checkpoint_io import install_atomic_checkpoints  # noqa: E402
from .engine.invalid_loss import install_invalid_loss_message  # noqa: E402

install_safe_loading()  # resume/load_from of runner checkpoints under torch>=2.6 (allow-list)
install_atomic_checkpoints()  # no half-written checkpoint; --resume falls back (reliability.md)
install_invalid_loss_message()  # mmdet's CheckInvalidLossHook names the iteration

__all__ = ['MODELS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'OPTIM_WRAPPERS', 'DATASETS', 'HOOKS',
           'LOOPS', 'bridge_to_hosts']

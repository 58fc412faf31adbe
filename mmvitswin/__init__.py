"""mmvitswin: Swin, ViT-Adapter, hybrid ResNet+ViT and Video Swin backbones for OpenMMLab.

Importing the package registers every module in mmvitswin's registries and bridges them into
MMDetection's and MMSegmentation's (see :mod:`mmvitswin.registry`).
"""
from .version import __version__
from . import datasets, engine, models  # noqa: F401  (registers every module)
from .registry import DATASETS, HOOKS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS, bridge_to_hosts

bridge_to_hosts()

from .checkpoint.safe_load import install_safe_loading  # noqa: E402

install_safe_loading()  # resume/load_from of runner checkpoints under torch>=2.6 (allow-list)

from .engine.checkpoint_io import install_atomic_checkpoints  # noqa: E402
from .engine.invalid_loss import install_invalid_loss_message  # noqa: E402

install_atomic_checkpoints()  # no half-written checkpoint; --resume falls back (reliability.md)
install_invalid_loss_message()  # mmdet's CheckInvalidLossHook names the iteration

__all__ = ['__version__', 'MODELS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'DATASETS', 'HOOKS',
           'bridge_to_hosts']

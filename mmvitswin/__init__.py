"""mmvitswin: Swin, Swin V2, ViT (DINOv2/DINOv3/SAM trunks, ViTDet and ViT-Adapter pyramids),
hybrid ResNet+ViT and Video Swin backbones as feature pyramids.

Two layers:

- :mod:`mmvitswin.core` needs torch only: the backbones as plain ``nn.Module`` s, their
  layers and checkpoint families. Importing it changes nothing global.
- :mod:`mmvitswin.openmmlab` registers them (and our heads, optimizer constructors, hooks,
  datasets) for MMEngine / MMDetection / MMSegmentation. ``import mmvitswin`` (what
  ``custom_imports=dict(imports=['mmvitswin'])`` does) imports it when MMEngine is installed.
"""
import importlib.util

from .version import __version__

if importlib.util.find_spec('mmengine') is not None:
    from . import openmmlab  # noqa: F401  (registers every module)
    from .openmmlab import (DATASETS, HOOKS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS,  # noqa: F401
                            bridge_to_hosts)

__all__ = ['__version__']

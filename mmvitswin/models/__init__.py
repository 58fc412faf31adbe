from .backbones import *  # noqa: F401,F403  (registers every backbone)
from .backbones import __all__ as _backbones

__all__ = list(_backbones)
from .mask_head import ChannelsLastFCNMaskHead  # noqa: E402
from .roi_extractor import SeparableRoIExtractor  # noqa: E402

__all__ += ['ChannelsLastFCNMaskHead', 'SeparableRoIExtractor']

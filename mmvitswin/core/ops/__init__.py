"""Detection operators in plain PyTorch (no compiled extension)."""
from .roi_align import SeparableRoIAlign, roi_align

__all__ = ['SeparableRoIAlign', 'roi_align']

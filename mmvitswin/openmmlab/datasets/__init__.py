"""Embedded data generators (the synthetic "shapes" data)."""
from .shapes import SHAPE_CLASSES, ShapesSegDataset, make_shapes, shapes_exist  # noqa: F401

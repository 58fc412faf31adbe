"""Embedded data generators (the synthetic "shapes" data)."""
from .shapes import (DEFAULT_IMAGE_SIZE, DEFAULT_NUM_TRAIN, DEFAULT_NUM_VAL,  # noqa: F401
                     DEFAULT_SEED, SHAPE_CLASSES, ShapesSegDataset, make_shapes, shapes_exist,
                     shapes_summary)

"""Embedded data generators (the synthetic "shapes" data)."""

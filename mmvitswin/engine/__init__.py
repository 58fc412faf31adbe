"""Training-time pieces registered into mmvitswin's (and the hosts') registries."""
from .layer_decay import LayerDecayOptimWrapperConstructor  # noqa: F401

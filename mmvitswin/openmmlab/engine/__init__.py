"""Training-time pieces registered into mmvitswin's (and the hosts') registries."""
from .amp import AmpTestLoop, CPUAmpOptimWrapper  # noqa: F401
from .grouped import GroupedOptimWrapperConstructor  # noqa: F401
from .layer_decay import LayerDecayOptimWrapperConstructor  # noqa: F401

"""Training-time pieces, registered into mmvitswin's (and the hosts') registries and selected
by configs and tools: nothing here replaces a part of MMEngine, MMDetection or mmcv."""
from .amp import AmpTestLoop, CPUAmpOptimWrapper  # noqa: F401
from .checkpoint_io import AtomicCheckpointHook  # noqa: F401
from .fsdp import FSDP2Strategy  # noqa: F401
from .grouped import GroupedOptimWrapperConstructor  # noqa: F401
from .invalid_loss import FiniteLossHook  # noqa: F401
from .layer_decay import LayerDecayOptimWrapperConstructor  # noqa: F401
from .runner import SafeCheckpointRunner  # noqa: F401

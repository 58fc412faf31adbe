"""Reading runner checkpoints under torch's ``weights_only`` unpickler.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``: it rebuilds tensors and plain
containers but refuses any other pickled global. MMEngine 0.10.7 calls ``torch.load`` without
the argument, so ``--resume`` and ``load_from`` of its own runner checkpoints fail with an
``UnpicklingError``: besides tensors, a runner checkpoint holds the message hub's
``HistoryBuffer`` objects (whose state is numpy arrays) and numpy scalars.

Instead of turning ``weights_only`` off for every file (which lets a checkpoint run arbitrary
code), :func:`load_runner_checkpoint` reads local files and http(s) URLs through the core's
file reader (:mod:`mmvitswin.core.checkpoint.files`: the one fetch path, the damaged-file
checks, the numpy allow-list) with exactly the runner's extra types allowed, for this call
only. :class:`~mmvitswin.openmmlab.engine.runner.SafeCheckpointRunner` (our configs' and tools'
runner) loads ``--resume`` and ``load_from`` files with it; MMEngine's own loaders and torch's
process-wide allow-list are left as they are. A file that needs anything else is refused with
:class:`UntrustedCheckpointError`; to load a file you trust anyway, set
``MMVITSWIN_TRUST_CHECKPOINTS=1`` for that run.

On torch < 2.6 (see :mod:`mmvitswin.core.compat`) the allow-list cannot be expressed
(``add_safe_globals`` is missing, or rejects the ``(object, "module.name")`` entries it needs) and
``torch.load`` does not default to weights-only. There checkpoints load as MMEngine itself loads
them on that torch: ``torch.load(..., weights_only=False)``, i.e. full pickle. That is **not**
safe against a malicious file (unpickling can run code embedded in it): load only checkpoints
you trust, as with plain MMDetection/MMSegmentation on that torch. ``WEIGHTS_ONLY_LOADING``
tells which behaviour is in force; nothing is refused when it is False.
"""
import os.path as osp
import pickle
from typing import List, Optional

from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

from ...core.checkpoint import files
from ...core.checkpoint.files import (TRUST_ENV, WEIGHTS_ONLY_LOADING,  # noqa: F401
                                      UntrustedCheckpointError)

_URL_PREFIXES = ('http://', 'https://')
# HistoryBuffer pickles its statistics methods (a dict of functions defined on the class) as
# ``getattr(HistoryBuffer, 'min')``. A real ``getattr`` in the allow-list would let a file walk
# from any allowed object to arbitrary code, so ``builtins.getattr`` maps to this stand-in.
_HISTORY_BUFFER_METHODS = ('min', 'max', 'current', 'mean')


def _history_buffer_method(owner, name: str):
    """``getattr`` restricted to ``HistoryBuffer.{min,max,current,mean}`` (see above)."""
    if owner is HistoryBuffer and name in _HISTORY_BUFFER_METHODS:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({getattr(owner, "__name__", type(owner).__name__)}, '
        f'{name!r}); only HistoryBuffer statistics methods are allowed')


def runner_globals() -> list:
    """What an MMEngine runner checkpoint holds beyond tensors, containers and numpy's types.

    Found by saving real runner checkpoints (Mask R-CNN and UPerNet, 1 and 2 processes) and
    listing ``torch.serialization.get_unsafe_globals_in_checkpoint``: the message hub's
    ``HistoryBuffer`` (with ``getattr`` for its methods, restricted: see
    :func:`_history_buffer_method`); the numpy arrays/scalars/dtypes inside it are the core's
    allow-list. Optimizer, scheduler, ``meta`` (config text, dataset classes and palette) and
    model state are plain containers, numbers, strings and tensors.
    """
    return [HistoryBuffer, (_history_buffer_method, 'builtins.getattr')]


def allowed_names() -> set:
    """Qualified names of every global a runner checkpoint may hold (numpy's included)."""
    return files.allowed_names(runner_globals())


def safe_torch_load(file, map_location=None, source: Optional[str] = None):
    """:func:`mmvitswin.core.checkpoint.files.safe_torch_load` with the runner-checkpoint
    types (:func:`runner_globals`) allowed as well."""
    return files.safe_torch_load(file, map_location=map_location, source=source,
                                 extra_globals=runner_globals())


def check_trusted(file: str) -> None:
    """:func:`mmvitswin.core.checkpoint.files.check_trusted` for a runner checkpoint."""
    files.check_trusted(file, extra_globals=runner_globals())


def load_runner_checkpoint(filename: str, map_location=None):
    """A runner checkpoint (``--resume``, ``load_from``) from a local path or an http(s) URL,
    weights-only with the runner's types allowed.

    URLs are fetched by :func:`mmvitswin.core.checkpoint.files.fetch_checkpoint` (torch hub's
    cache, rank 0 first); a missing, empty, truncated or foreign file is one
    :class:`~mmvitswin.core.checkpoint.files.CheckpointError` naming it and the cause, a file
    with pickled code :class:`UntrustedCheckpointError`. Other schemes (``open-mmlab://``,
    ``s3://`` ...) are MMEngine's ``CheckpointLoader``'s.
    """
    if filename.startswith(_URL_PREFIXES):
        path = files.fetch_checkpoint(filename)
    elif '://' in filename:
        return CheckpointLoader.load_checkpoint(filename, map_location=map_location)
    else:
        path = osp.expanduser(filename)
    files.check_checkpoint_file(path, source=filename)
    return safe_torch_load(path, map_location=map_location, source=filename)


__all__: List[str] = ['TRUST_ENV', 'WEIGHTS_ONLY_LOADING', 'UntrustedCheckpointError',
                      'runner_globals', 'allowed_names', 'safe_torch_load', 'check_trusted',
                      'load_runner_checkpoint']

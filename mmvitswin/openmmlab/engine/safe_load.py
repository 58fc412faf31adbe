"""Loading runner checkpoints under torch's ``weights_only`` unpickler.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``: it rebuilds tensors and plain
containers but refuses any other pickled global. MMEngine 0.10.7 calls ``torch.load`` without
the argument, so ``--resume`` and ``load_from`` of its own runner checkpoints fail with an
``UnpicklingError``: besides tensors, a runner checkpoint holds the message hub's
``HistoryBuffer`` objects (whose state is numpy arrays) and numpy scalars.

Instead of turning ``weights_only`` off for every file (which lets a checkpoint run arbitrary
code), :func:`install_safe_loading` allow-lists exactly those types and replaces MMEngine's
local and HTTP(S) checkpoint loaders with ones that explain a refusal. A file that needs
anything else is refused with :class:`UntrustedCheckpointError`; to load a file you trust
anyway, set ``MMVITSWIN_TRUST_CHECKPOINTS=1`` for that run.

On torch < 2.6 (see :mod:`mmvitswin.core.compat`) the allow-list cannot be expressed
(``add_safe_globals`` is missing, or rejects the ``(object, "module.name")`` entries it needs) and
``torch.load`` does not default to weights-only. There checkpoints load as MMEngine itself loads
them on that torch: ``torch.load(..., weights_only=False)``, i.e. full pickle. That is **not**
safe against a malicious file (unpickling can run code embedded in it): load only checkpoints
you trust, as with plain MMDetection/MMSegmentation on that torch. ``WEIGHTS_ONLY_LOADING``
tells which behaviour is in force; nothing is refused when it is False.
"""
import os
import os.path as osp
import pickle
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.logging import HistoryBuffer

from ...core import compat
from ...core.checkpoint import files
from ...core.checkpoint.files import (TRUST_ENV, WEIGHTS_ONLY_LOADING,  # noqa: F401
                                      UntrustedCheckpointError)

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


def checkpoint_safe_globals() -> list:
    """Every non-tensor global that MMEngine/MMDetection/MMSegmentation runner checkpoints hold.

    Found by saving real runner checkpoints (Mask R-CNN and UPerNet, 1 and 2 processes) and
    listing ``torch.serialization.get_unsafe_globals_in_checkpoint``: the message hub's
    ``HistoryBuffer`` (with ``getattr`` for its methods, restricted: see
    :func:`_history_buffer_method`) and the numpy arrays/scalars/dtypes inside it. Optimizer,
    scheduler, ``meta`` (config text, dataset classes and palette) and model state are plain
    containers, numbers, strings and tensors, which the weights-only unpickler accepts as is.
    """
    return [HistoryBuffer, (_history_buffer_method, 'builtins.getattr')] + files.numpy_globals()


def runner_globals() -> list:
    """What a runner checkpoint holds beyond numpy's types (see :func:`checkpoint_safe_globals`)."""
    return [HistoryBuffer, (_history_buffer_method, 'builtins.getattr')]


def safe_torch_load(file, map_location=None, source: Optional[str] = None):
    """:func:`mmvitswin.core.checkpoint.files.safe_torch_load` with the runner-checkpoint
    types (:func:`checkpoint_safe_globals`) allowed as well."""
    return files.safe_torch_load(file, map_location=map_location, source=source,
                                 extra_globals=runner_globals())


def check_trusted(file: str) -> None:
    """:func:`mmvitswin.core.checkpoint.files.check_trusted` for a runner checkpoint."""
    files.check_trusted(file, extra_globals=runner_globals())


def load_from_local(filename: str, map_location=None):
    """MMEngine's local-file checkpoint scheme, through :func:`safe_torch_load`."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    from ...core.checkpoint.files import check_checkpoint_file  # empty/truncated/foreign: say so, not "untrusted"
    check_checkpoint_file(filename)
    return safe_torch_load(filename, map_location=map_location)


def _download(url: str, model_dir: Optional[str]) -> str:
    """Download ``url`` into torch hub's checkpoint cache (same place ``load_url`` uses)."""
    from urllib.parse import urlparse
    model_dir = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints')
    os.makedirs(model_dir, exist_ok=True)
    path = osp.join(model_dir, osp.basename(urlparse(url).path))
    if not osp.exists(path):
        try:
            torch.hub.download_url_to_file(url, path, progress=False)
        except Exception as exc:  # offline: name the URL, the cache path and the way out
            from ...core.checkpoint.files import download_error
            raise download_error(url, exc, path) from None
    return path


def load_from_http(filename: str, map_location=None, model_dir: Optional[str] = None):
    """MMEngine's HTTP(S) checkpoint scheme: download (rank 0 first), then safe-load."""
    from mmengine.dist import get_dist_info
    rank, world_size = get_dist_info()
    if rank == 0:
        path = _download(filename, model_dir)
    if world_size > 1:
        torch.distributed.barrier()
        if rank > 0:
            path = _download(filename, model_dir)
    return safe_torch_load(path, map_location=map_location, source=filename)


_installed = False


def install_safe_loading() -> None:
    """Allow-list runner-checkpoint types for ``torch.load`` and route MMEngine through us.

    Idempotent. Called when :mod:`mmvitswin` is imported, so configs with
    ``custom_imports=['mmvitswin']`` and our tools get working ``--resume``/``load_from``. On
    torch < 2.6 the loaders installed behave as MMEngine's own (full pickle).
    """
    global _installed
    if _installed:
        return
    # Global allow-list: covers torch.load calls that do not go through CheckpointLoader
    # (a no-op on torch < 2.6, which does not default to weights-only).
    compat.add_safe_globals(checkpoint_safe_globals())
    from mmengine.runner import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
    CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), loader=load_from_http,
                                     force=True)
    _installed = True

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

On torch < 2.6 (see :mod:`mmvitswin.compat`) the allow-list cannot be expressed
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

import numpy as np
import torch

from .. import compat

TRUST_ENV = 'MMVITSWIN_TRUST_CHECKPOINTS'
# True: the allow-listed weights-only unpickler (torch >= 2.6). False: full pickle, as MMEngine.
WEIGHTS_ONLY_LOADING = compat.HAS_SAFE_GLOBAL_ALIASES

# numpy moved its pickling helpers from numpy.core to numpy._core in 2.0; a checkpoint written
# under either version names the module it was saved with, so both names are allowed.
_NUMPY_CORE_MODULES = ('numpy.core.multiarray', 'numpy._core.multiarray')


def _numpy_globals() -> List[Union[Callable, Tuple[Callable, str]]]:
    """numpy arrays, dtypes and scalars, as pickled by ``np.ndarray.__reduce__`` & co."""
    multiarray = getattr(np, '_core', None)
    multiarray = multiarray.multiarray if multiarray is not None else np.core.multiarray
    allowed: List[Union[Callable, Tuple[Callable, str]]] = [np.ndarray, np.dtype]
    for module in _NUMPY_CORE_MODULES:
        allowed.append((multiarray._reconstruct, f'{module}._reconstruct'))
        allowed.append((multiarray.scalar, f'{module}.scalar'))
    # numpy >= 1.25 pickles a dtype as its class, e.g. numpy.dtypes.Float64DType
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        for name in dir(dtypes):
            cls = getattr(dtypes, name)
            if isinstance(cls, type) and issubclass(cls, np.dtype):
                allowed.append(cls)
    return allowed


# HistoryBuffer pickles its statistics methods (a dict of functions defined on the class) as
# ``getattr(HistoryBuffer, 'min')``. A real ``getattr`` in the allow-list would let a file walk
# from any allowed object to arbitrary code, so ``builtins.getattr`` maps to this stand-in.
_HISTORY_BUFFER_METHODS = ('min', 'max', 'current', 'mean')


def _history_buffer_method(owner, name: str):
    """``getattr`` restricted to ``HistoryBuffer.{min,max,current,mean}`` (see above)."""
    from mmengine.logging import HistoryBuffer
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
    from mmengine.logging import HistoryBuffer
    return [HistoryBuffer, (_history_buffer_method, 'builtins.getattr')] + _numpy_globals()


def _allowed_names() -> set:
    names = set()
    for item in checkpoint_safe_globals():
        if isinstance(item, tuple):
            names.add(item[1])
        else:
            names.add(f'{item.__module__}.{item.__qualname__}')
    return names


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds pickled objects outside the allow-list (subclass of UnpicklingError)."""


def _trusted() -> bool:
    return os.environ.get(TRUST_ENV, '').strip().lower() in ('1', 'true', 'yes')


def _refusal(source: str, exc: Exception, file: Optional[str]) -> UntrustedCheckpointError:
    found: Sequence[str] = ()
    if file is not None:
        try:
            allowed = _allowed_names()
            found = [g for g in (compat.unsafe_globals_in_checkpoint(file) or ())
                     if g not in allowed]
        except Exception:  # not a zip checkpoint: fall back to torch's own message below
            found = ()
    # torch wraps the specific reason in generic advice: keep the text after its marker, up to
    # the closing pointer to the docs
    text = str(exc)
    reason = text.split('WeightsUnpickler error:', 1)[-1].split('Check the documentation')[0]
    reason = ' '.join(reason.split()) or text.strip().splitlines()[0]
    what = (f'objects of types outside the allow-list: {", ".join(found)}' if found else
            f'data the weights-only unpickler refused ({reason})')
    return UntrustedCheckpointError(
        f'Refusing to load checkpoint {source}: it contains {what}. Unpickling such objects '
        f'can run arbitrary code, so mmvitswin only loads tensors, plain containers and the '
        f'types that MMEngine runner checkpoints hold. If you trust this file, load it with '
        f'the environment variable {TRUST_ENV}=1 set (e.g. `{TRUST_ENV}=1 python tools/'
        f'train.py ...`), or re-save just its state dict with torch.save().')


def safe_torch_load(file, map_location=None, source: Optional[str] = None):
    """``torch.load`` with the weights-only unpickler plus the runner-checkpoint allow-list.

    Raises :class:`UntrustedCheckpointError` (naming the offending types and how to override)
    for anything else, unless ``MMVITSWIN_TRUST_CHECKPOINTS=1`` is set. On torch < 2.6
    (``WEIGHTS_ONLY_LOADING`` False) this is plain ``torch.load(weights_only=False)``, as in
    MMEngine: see the module docstring.
    """
    source = source or (file if isinstance(file, str) else 'from a file object')
    if _trusted() or not WEIGHTS_ONLY_LOADING:
        return torch.load(file, map_location=map_location, weights_only=False)
    # add_safe_globals, not the safe_globals context manager: leaving that context removes its
    # entries from the process-wide allow-list that install_safe_loading() set up.
    compat.add_safe_globals(checkpoint_safe_globals())
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _refusal(source, exc, file if isinstance(file, str) else None) from None


def check_trusted(file: str) -> None:
    """Raise :class:`UntrustedCheckpointError` now if loading ``file`` would be refused.

    Reads only the pickle stream (not the tensor data), so tools can reject a ``--resume`` /
    ``load_from`` file before building anything. Files that are not zip checkpoints are left to
    :func:`safe_torch_load`. A no-op on torch < 2.6, where nothing is refused.
    """
    if _trusted() or not WEIGHTS_ONLY_LOADING:
        return
    try:
        found = compat.unsafe_globals_in_checkpoint(file)
    except Exception:
        return
    if found is not None and set(found) - _allowed_names():
        raise _refusal(file, pickle.UnpicklingError('disallowed globals'), file)


def load_from_local(filename: str, map_location=None):
    """MMEngine's local-file checkpoint scheme, through :func:`safe_torch_load`."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    from .loading import check_checkpoint_file  # empty/truncated/foreign: say so, not "untrusted"
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
            from .loading import download_error
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

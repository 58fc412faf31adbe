"""Reading checkpoint files: local paths and http(s) URLs, weights-only.

The one file-fetching path of mmvitswin (the OpenMMLab layer's runner-checkpoint loading goes
through it too). Needs torch only. :func:`load_checkpoint_file` classifies a file before
unpickling anything (missing, empty, truncated, foreign: one :class:`CheckpointError` naming
the file and the cause) and loads it with torch's weights-only unpickler plus an allow-list of
numpy types (:func:`safe_torch_load`); a file that needs anything else is refused with
:class:`UntrustedCheckpointError` unless ``MMVITSWIN_TRUST_CHECKPOINTS=1`` is set.

On torch < 2.6 (see :mod:`mmvitswin.core.compat`) the allow-list cannot be expressed and
``torch.load`` does not default to weights-only: files load with full pickle there, as
MMEngine itself loads them on that torch. Load only files you trust on such a torch.
"""
import os
import os.path as osp
import pickle
import pickletools
import zipfile
from typing import Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import compat

_URL_PREFIXES = ('http://', 'https://')
LOCAL_COPY_HINT = ('--cfg-options model.backbone.init_cfg.checkpoint=/path/to/local/copy.pth')
TRUST_ENV = 'MMVITSWIN_TRUST_CHECKPOINTS'
# True: the allow-listed weights-only unpickler (torch >= 2.6). False: full pickle.
WEIGHTS_ONLY_LOADING = compat.HAS_SAFE_GLOBAL_ALIASES

# ------------------------------------------------------------------------------ errors
class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded. ``source`` is the file or URL, ``cause`` one of
    ``'missing'``, ``'damaged'``, ``'not a checkpoint'``, ``'other model'``,
    ``'unreachable'``; the message names both. (Refused pickled code is
    :class:`UntrustedCheckpointError`.)"""

    def __init__(self, source: str, cause: str, detail: str):
        self.source = str(source)
        self.cause = cause
        super().__init__(f'checkpoint {source} is unusable ({cause}): {detail}')


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path that does not exist (also a ``FileNotFoundError``)."""

    def __init__(self, source: str, detail: str):
        CheckpointError.__init__(self, source, 'missing', detail)

    def __str__(self) -> str:  # OSError would print its errno/filename form
        return self.args[0]


# --------------------------------------------------------------- weights-only unpickling
# numpy moved its pickling helpers from numpy.core to numpy._core in 2.0; a checkpoint written
# under either version names the module it was saved with, so both names are allowed.
_NUMPY_CORE_MODULES = ('numpy.core.multiarray', 'numpy._core.multiarray')


def numpy_globals() -> List[Union[Callable, Tuple[Callable, str]]]:
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


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds pickled objects outside the allow-list (subclass of UnpicklingError)."""


def trusted() -> bool:
    return os.environ.get(TRUST_ENV, '').strip().lower() in ('1', 'true', 'yes')


def refusal(source: str, exc: Exception, file: Optional[str],
            extra_globals: Sequence = ()) -> UntrustedCheckpointError:
    found: Sequence[str] = ()
    if file is not None:
        try:
            allowed = allowed_names(extra_globals)
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




def allowed_names(extra_globals: Sequence = ()) -> set:
    """Qualified names of the allow-listed globals (numpy's plus ``extra_globals``)."""
    names = set()
    for item in list(numpy_globals()) + list(extra_globals):
        if isinstance(item, tuple):
            names.add(item[1])
        else:
            names.add(f'{item.__module__}.{item.__qualname__}')
    return names


def safe_torch_load(file, map_location=None, source: Optional[str] = None,
                    extra_globals: Sequence = ()):
    """``torch.load`` with the weights-only unpickler, numpy's array/scalar/dtype types and
    ``extra_globals`` allowed (entries as for ``torch.serialization.add_safe_globals``).

    Raises :class:`UntrustedCheckpointError` (naming the offending types and how to override)
    for anything else, unless ``MMVITSWIN_TRUST_CHECKPOINTS=1`` is set. On torch < 2.6
    (``WEIGHTS_ONLY_LOADING`` False) this is ``torch.load(weights_only=False)``. The allow-list
    is scoped to this call (torch's process-wide list is left as it was).
    """
    source = source or (file if isinstance(file, str) else 'from a file object')
    if trusted() or not WEIGHTS_ONLY_LOADING:
        return torch.load(file, map_location=map_location, weights_only=False)
    entries = list(numpy_globals()) + list(extra_globals)
    try:
        with compat.safe_globals(entries):
            return torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise refusal(source, exc, file if isinstance(file, str) else None,
                      extra_globals) from None


def check_trusted(file: str, extra_globals: Sequence = ()) -> None:
    """Raise :class:`UntrustedCheckpointError` now if loading ``file`` would be refused.

    Reads only the pickle stream (not the tensor data), so tools can reject a file before
    building anything. Files that are not zip checkpoints are left to :func:`safe_torch_load`.
    A no-op on torch < 2.6, where nothing is refused.
    """
    if trusted() or not WEIGHTS_ONLY_LOADING:
        return
    try:
        found = compat.unsafe_globals_in_checkpoint(file)
    except Exception:
        return
    if found is not None and set(found) - allowed_names(extra_globals):
        raise refusal(file, pickle.UnpicklingError('disallowed globals'), file, extra_globals)


# ------------------------------------------------------------------------- files and URLs
def _dist_info() -> Tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) outside a distributed run."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def hub_cache_path(url: str) -> str:
    """Where a checkpoint URL is cached: torch hub's ``checkpoints`` dir (mmengine's too)."""
    from urllib.parse import urlparse
    return osp.join(torch.hub.get_dir(), 'checkpoints', osp.basename(urlparse(url).path))


def download_error(url: str, exc: BaseException, path: Optional[str] = None) -> CheckpointError:
    """The error for a checkpoint URL that could not be fetched (offline machine, bad URL)."""
    path = path or hub_cache_path(url)
    return CheckpointError(
        url, 'unreachable',
        f'downloading it failed ({type(exc).__name__}: {exc}). Without network access, fetch '
        f'the file on another machine and either copy it to {path} (the torch hub checkpoint '
        f'cache, used instead of the URL when present) or point the config at a local copy, '
        f'e.g. {LOCAL_COPY_HINT}')


def fetch_checkpoint(url: str) -> str:
    """Local path of a checkpoint URL: the cached copy, else downloaded into the cache (rank
    0 first in a distributed run). Raises :class:`CheckpointError` ('unreachable')."""
    path = hub_cache_path(url)
    if osp.isfile(path):
        return path
    rank, world_size = _dist_info()
    failure: Optional[BaseException] = None
    if rank == 0:
        try:
            os.makedirs(osp.dirname(path), exist_ok=True)
            torch.hub.download_url_to_file(url, path, progress=False)
        except Exception as exc:  # URLError, HTTPError, timeouts, disk errors
            failure = exc
    if world_size > 1:
        torch.distributed.barrier()
    if failure is None and not osp.isfile(path):
        failure = FileNotFoundError(f'rank 0 did not leave {path}')
    if failure is not None:
        raise download_error(url, failure, path) from None
    return path


def _pickles_parse(path: str, count: int = 5) -> bool:
    """Whether the first ``count`` pickles of a legacy ``torch.save`` file parse completely
    (opcode scan only, nothing is executed or imported)."""
    try:
        with open(path, 'rb') as f:
            for _ in range(count):
                for _op in pickletools.genops(f):
                    pass
    except Exception:
        return False
    return True


def check_checkpoint_file(path: str, source: Optional[str] = None) -> str:
    """Classify a local checkpoint file before unpickling anything; return its kind
    ('zip' or 'legacy'). Raises :class:`CheckpointError` naming the file for a missing,
    empty, truncated or foreign file."""
    source = source or path
    if not osp.exists(path):
        raise CheckpointNotFoundError(source, f'no such file ({osp.abspath(path)})')
    if osp.isdir(path):
        raise CheckpointError(source, 'not a checkpoint', 'it is a directory')
    size = osp.getsize(path)
    if size == 0:
        raise CheckpointError(source, 'damaged', 'the file is empty (0 bytes): an interrupted '
                              'save or download?')
    with open(path, 'rb') as f:
        head = f.read(64)
    if head.startswith(b'PK\x03\x04'):
        if not zipfile.is_zipfile(path):
            raise CheckpointError(source, 'damaged', f'a zip checkpoint without its end record '
                                  f'({size} bytes): truncated by an interrupted save or '
                                  f'download?')
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise CheckpointError(source, 'damaged', f'unreadable zip archive ({exc})') from None
        if not any(n.endswith('data.pkl') for n in names):
            raise CheckpointError(source, 'not a checkpoint', 'a zip archive without the '
                                  f'data.pkl of torch.save (entries: {names[:5]})')
        return 'zip'
    if head[:1] == b'\x80':  # a pickle: the format of torch.save before PyTorch 1.6
        if not _pickles_parse(path):
            raise CheckpointError(source, 'damaged', 'its pickle stream ends early or is '
                                  'corrupt (a truncated legacy torch.save file?)')
        return 'legacy'
    what = 'text (an HTML error page or a pointer file?)' if head.lstrip()[:1] in (
        b'<', b'{', b'v') else f'starts with bytes {head[:8]!r}'
    raise CheckpointError(source, 'not a checkpoint', f'neither a PyTorch zip checkpoint nor a '
                          f'legacy torch.save pickle: {what}')


def load_checkpoint_file(checkpoint: str, map_location='cpu') -> dict:
    """Load a checkpoint from a local path or an http(s) URL through the safe weights-only
    loader.

    Every failure is one error naming the file and the cause: :class:`CheckpointError`
    ('missing' as :class:`CheckpointNotFoundError`, 'damaged', 'not a checkpoint',
    'unreachable') or :class:`UntrustedCheckpointError`
    (pickled objects outside the allow-list; nothing of them is executed).
    """
    if isinstance(checkpoint, os.PathLike):
        checkpoint = os.fspath(checkpoint)
    if not isinstance(checkpoint, str):
        raise TypeError(f'checkpoint must be a path or URL string, got {type(checkpoint).__name__}')
    if '://' in checkpoint and not checkpoint.startswith(_URL_PREFIXES):
        raise CheckpointError(checkpoint, 'unreachable', 'only local paths and http(s) URLs '
                              'are read here; other schemes (open-mmlab://, s3://, ...) are '
                              "MMEngine's: build the backbone from a config (mmvitswin's "
                              'registered classes read them through MMEngine)')
    path = fetch_checkpoint(checkpoint) if checkpoint.startswith(_URL_PREFIXES) else \
        osp.expanduser(checkpoint)
    check_checkpoint_file(path, source=checkpoint)
    try:
        obj = safe_torch_load(path, map_location=map_location, source=checkpoint)
    except UntrustedCheckpointError:
        raise
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError,
            ValueError, KeyError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(checkpoint, 'damaged', f'torch.load failed: {first}') from None
    if not isinstance(obj, dict):
        raise CheckpointError(checkpoint, 'not a checkpoint', f'it holds a '
                              f'{type(obj).__name__}, not a dict of tensors')
    return obj

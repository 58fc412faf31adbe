"""Reading checkpoint files: local paths and http(s) URLs, weights-only.

The one file-fetching path of mmvitswin (the OpenMMLab layer's runner-checkpoint loading goes
through it too). Needs torch (and the ``safetensors`` package for ``.safetensors`` files).

:func:`read_checkpoint` accepts

- a ``torch.save`` file (``.pth``/``.pt``, zip or legacy pickle; ``pytorch_model.bin``),
- a ``.safetensors`` file (read by the ``safetensors`` library: no pickle at all),
- a sharded checkpoint's index (``model.safetensors.index.json``,
  ``pytorch_model.bin.index.json``): every shard of its ``weight_map`` is read and merged,
- a HuggingFace snapshot directory (``config.json`` + ``model.safetensors`` / sharded /
  ``pytorch_model.bin``), including a hub cache entry (``.../models--org--name`` itself, whose
  ``refs/main`` names the snapshot, or ``.../snapshots/<revision>``): nothing is downloaded,
  so this works under ``HF_HUB_OFFLINE=1``,

and returns the dict the file held plus the parsed ``config.json`` found with HF-style
weights (:class:`Checkpoint`). Torch files are classified before unpickling anything
(missing, empty, truncated, foreign: one :class:`CheckpointError` naming the file and the
cause) and loaded with torch's weights-only unpickler plus an allow-list of numpy types
(:func:`safe_torch_load`); a file that needs anything else is refused with
:class:`UntrustedCheckpointError` unless ``MMVITSWIN_TRUST_CHECKPOINTS=1`` is set.
Safetensors headers are checked against the file size before the library reads them.

On torch < 2.6 (see :mod:`mmvitswin.core.compat`) the allow-list cannot be expressed and
``torch.load`` does not default to weights-only: files load with full pickle there, as
MMEngine itself loads them on that torch. Load only files you trust on such a torch.
"""
import json
import os
import os.path as osp
import pickle
import pickletools
import struct
import zipfile
from urllib.parse import urlparse
from collections import OrderedDict
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import compat

try:  # optional: only .safetensors files need it
    import safetensors.torch as safetensors_torch
except ImportError:  # pragma: no cover - exercised only without the package
    safetensors_torch = None

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
        self.detail = detail
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
                    extra_globals: Sequence = (), mmap: bool = False):
    """``torch.load`` with the weights-only unpickler, numpy's array/scalar/dtype types and
    ``extra_globals`` allowed (entries as for ``torch.serialization.add_safe_globals``).

    Raises :class:`UntrustedCheckpointError` (naming the offending types and how to override)
    for anything else, unless ``MMVITSWIN_TRUST_CHECKPOINTS=1`` is set. On torch < 2.6
    (``WEIGHTS_ONLY_LOADING`` False) this is ``torch.load(weights_only=False)``. The allow-list
    is scoped to this call (torch's process-wide list is left as it was). ``mmap``: the tensors
    stay in the (memory-mapped) file until read (zip checkpoints).
    """
    source = source or (file if isinstance(file, str) else 'from a file object')
    more = dict(mmap=True) if mmap else {}
    if trusted() or not WEIGHTS_ONLY_LOADING:
        return torch.load(file, map_location=map_location, weights_only=False, **more)
    entries = list(numpy_globals()) + list(extra_globals)
    try:
        with compat.safe_globals(entries):
            return torch.load(file, map_location=map_location, weights_only=True, **more)
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


def _existing_file(path: str, source: str) -> int:
    """The size of the non-empty local file ``path``; :class:`CheckpointError` naming
    ``source`` when it is missing ('missing'), a directory or empty."""
    if not osp.exists(path):
        raise CheckpointNotFoundError(source, f'no such file ({osp.abspath(path)})')
    if osp.isdir(path):
        raise CheckpointError(source, 'not a checkpoint', 'it is a directory')
    size = osp.getsize(path)
    if size == 0:
        raise CheckpointError(source, 'damaged', 'the file is empty (0 bytes): an interrupted '
                              'save or download?')
    return size


def check_checkpoint_file(path: str, source: Optional[str] = None) -> str:
    """Classify a local checkpoint file before unpickling anything; return its kind
    ('zip' or 'legacy'). Raises :class:`CheckpointError` naming the file for a missing,
    empty, truncated or foreign file."""
    source = source or path
    size = _existing_file(path, source)
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


# ------------------------------------------------------------------ safetensors and shards
SNAPSHOT_WEIGHTS = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin',
                    'pytorch_model.bin.index.json')
_WEIGHT_SUFFIXES = ('.safetensors', '.bin', '.pth', '.pt')
_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024  # the library's own limit on the JSON header


class Checkpoint(NamedTuple):
    """What :func:`read_checkpoint` read.

    - ``obj``: the dict the file held (a state dict, or a container such as a runner
      checkpoint; see :func:`~.loading.unwrap_state_dict`).
    - ``config``: the parsed ``config.json`` of a HuggingFace snapshot (in the directory, or
      beside a ``.safetensors`` / ``.bin`` / index file), else None.
    - ``source``: the path or URL as given (what errors name).
    - ``kind``: ``'torch'`` (``.pth``/``.pt`` & co), ``'bin'`` (a ``*.bin`` torch file),
      ``'safetensors'``, ``'sharded'`` (an index and its shards) or ``'hf-snapshot'`` (a
      directory).
    """
    obj: dict
    config: Optional[dict]
    source: str
    kind: str


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    """A safetensors file: an 8-byte little-endian header length, then the JSON header."""
    if len(head) < 9 or head[8:9] != b'{':
        return False
    n = struct.unpack('<Q', head[:8])[0]
    return 1 < n <= _SAFETENSORS_MAX_HEADER


def check_safetensors_file(path: str, source: Optional[str] = None) -> Dict[str, dict]:
    """Validate a ``.safetensors`` file's header against its size (nothing else is read);
    return the header's tensor entries. :class:`CheckpointError` ('damaged', 'not a
    checkpoint', 'missing') naming the file otherwise: the library's own errors on a truncated
    file do not say which file or why."""
    source = source or path
    size = _existing_file(path, source)
    with open(path, 'rb') as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(source, 'damaged', f'a {size}-byte file cannot hold a '
                                  'safetensors header: truncated?')
        n = struct.unpack('<Q', head)[0]
        if n > _SAFETENSORS_MAX_HEADER:
            raise CheckpointError(source, 'not a checkpoint', f'not in the safetensors format '
                                  f'(starts with bytes {head!r})')
        if 8 + n > size:
            raise CheckpointError(source, 'damaged', f'its safetensors header claims {n} bytes '
                                  f'but the file has {size}: truncated by an interrupted save '
                                  f'or download?')
        raw = f.read(n)
    try:
        header = json.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(source, 'damaged', f'its safetensors header is not valid JSON '
                              f'({exc})') from None
    if not isinstance(header, dict):
        raise CheckpointError(source, 'damaged', 'its safetensors header is not a JSON object')
    tensors = {k: v for k, v in header.items() if k != '__metadata__'}
    data = size - 8 - n
    try:
        end = max((int(v['data_offsets'][1]) for v in tensors.values()), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        raise CheckpointError(source, 'damaged', 'its safetensors header has entries '
                              'without data_offsets') from None
    if end > data:
        raise CheckpointError(source, 'damaged', f'its tensors need {end} bytes of data but the '
                              f'file holds {data} after the header: truncated by an interrupted '
                              f'save or download?')
    return tensors


def _device_of(map_location) -> str:
    """safetensors' ``device`` for a ``torch.load``-style ``map_location`` (str or device;
    anything else, e.g. a dict or callable, loads on the CPU)."""
    if isinstance(map_location, torch.device):
        return str(map_location)
    return map_location if isinstance(map_location, str) else 'cpu'


# safetensors dtype names -> torch
_SAFETENSORS_DTYPES = {
    'F64': torch.float64, 'F32': torch.float32, 'F16': torch.float16, 'BF16': torch.bfloat16,
    'I64': torch.int64, 'I32': torch.int32, 'I16': torch.int16, 'I8': torch.int8,
    'U8': torch.uint8, 'BOOL': torch.bool}


def mmap_safetensors_file(path: str, header: Dict[str, dict], source: str) -> dict:
    """The tensors of a checked ``.safetensors`` file (``header``: its entries) as views of the
    memory-mapped file: nothing is read until used, and reading a slice reads only that slice
    (a process loading its shard of each tensor)."""
    size = osp.getsize(path)
    with open(path, 'rb') as f:
        start = 8 + struct.unpack('<Q', f.read(8))[0]
    data = torch.UntypedStorage.from_file(path, False, size)  # (filename, shared, nbytes)
    flat = torch.empty(0, dtype=torch.uint8).set_(data)
    out = OrderedDict()
    for key, entry in header.items():
        dtype = _SAFETENSORS_DTYPES.get(entry.get('dtype'))
        if dtype is None:
            raise CheckpointError(source, 'damaged', f'{key} has dtype {entry.get("dtype")!r}, '
                                  'which this reader does not know')
        lo, hi = (start + int(v) for v in entry['data_offsets'])
        raw = flat[lo:hi]
        if lo % dtype.itemsize:  # a misaligned tensor: copied (views need aligned storage)
            raw = raw.clone()
        out[key] = raw.view(dtype).view(entry['shape'])
    return out


def load_safetensors_file(path: str, map_location='cpu', source: Optional[str] = None,
                          mmap: bool = False) -> dict:
    """The tensors of a ``.safetensors`` file, checked first (:func:`check_safetensors_file`);
    ``mmap``: as views of the mapped file (:func:`mmap_safetensors_file`)."""
    source = source or path
    header = check_safetensors_file(path, source)
    if mmap:
        return mmap_safetensors_file(path, header, source)
    if safetensors_torch is None:
        raise ImportError(f'reading {source} needs the safetensors package: '
                          f'pip install safetensors')
    try:
        return OrderedDict(safetensors_torch.load_file(path, device=_device_of(map_location)))
    except Exception as exc:  # SafetensorError (bad dtype, overlapping offsets), OSError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(source, 'damaged', f'the safetensors library refused it: '
                              f'{first}') from None


def _load_torch_file(path: str, map_location, source: str, mmap: bool = False) -> dict:
    check_checkpoint_file(path, source=source)
    try:
        obj = safe_torch_load(path, map_location=map_location, source=source,
                              mmap=mmap and zipfile.is_zipfile(path))
    except UntrustedCheckpointError:
        raise
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError,
            ValueError, KeyError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(source, 'damaged', f'torch.load failed: {first}') from None
    if not isinstance(obj, dict):
        raise CheckpointError(source, 'not a checkpoint', f'it holds a '
                              f'{type(obj).__name__}, not a dict of tensors')
    return obj


def _read_json(path: str, source: str, what: str) -> dict:
    try:
        with open(path, 'rb') as f:
            value = json.loads(f.read().decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(source, 'damaged', f'{what} {path} is not valid JSON ({exc})') \
            from None
    except OSError as exc:
        raise CheckpointError(source, 'damaged', f'{what} {path} cannot be read ({exc})') \
            from None
    if not isinstance(value, dict):
        raise CheckpointError(source, 'damaged', f'{what} {path} is not a JSON object')
    return value


def _config_beside(path: str, source: str) -> Optional[dict]:
    """The ``config.json`` in the directory of a HuggingFace-style weights file, if any."""
    config = osp.join(osp.dirname(osp.abspath(path)), 'config.json')
    return _read_json(config, source, 'its config') if osp.isfile(config) else None


def load_sharded_checkpoint(index: str, map_location='cpu', source: Optional[str] = None,
                            mmap: bool = False) -> dict:
    """Read every shard named by a ``*.index.json`` (``{"weight_map": {key: shard file}}``,
    shards beside the index) and merge them (``mmap``: each shard mapped). A missing shard is a
    :class:`CheckpointNotFoundError`, a damaged one or a key the index promises but its shard
    lacks a :class:`CheckpointError`; all name the index and the shard."""
    source = source or index
    meta = _read_json(index, source, 'the index')
    weight_map = meta.get('weight_map')
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(source, 'not a checkpoint', 'a JSON file without the '
                              '"weight_map" of a sharded checkpoint index')
    root = osp.dirname(osp.abspath(index))
    shards = list(OrderedDict.fromkeys(weight_map.values()))
    for shard in shards:  # all present before reading any: one error for an incomplete copy
        if not isinstance(shard, str) or not osp.isfile(osp.join(root, shard)):
            listed = sum(1 for v in weight_map.values() if v == shard)
            raise CheckpointNotFoundError(source, f'shard {shard} ({listed} tensors of its '
                                          f'weight_map) does not exist in {root}')
    merged: Dict[str, torch.Tensor] = OrderedDict()
    for shard in shards:
        path = osp.join(root, shard)
        try:
            part = _load_weights_file(path, map_location, path, mmap)[0]
        except CheckpointNotFoundError as exc:  # a dangling hub-cache link
            raise CheckpointNotFoundError(source, f'shard {shard}: {exc.detail}') from None
        except CheckpointError as exc:
            raise CheckpointError(source, exc.cause, f'shard {shard}: {exc.detail}') from None
        merged.update(part)
    lacking = [k for k, v in weight_map.items() if k not in merged]
    if lacking:
        raise CheckpointError(source, 'damaged', f'its weight_map lists {len(lacking)} tensors '
                              f'that their shards lack, e.g. {lacking[0]} (in '
                              f'{weight_map[lacking[0]]})')
    return merged


def _load_weights_file(path: str, map_location, source: str,
                       mmap: bool = False) -> Tuple[dict, str]:
    """One local weights file of any supported kind -> (dict, kind); classified by content
    (a zip / pickle is torch's whatever its name), then by name. ``mmap``: tensors left in the
    mapped file until read (safetensors and zip checkpoints)."""
    if not osp.exists(path):
        raise CheckpointNotFoundError(source, f'no such file ({osp.abspath(path)})')
    name = osp.basename(path)
    if name.endswith('.json') and osp.isfile(path):
        return load_sharded_checkpoint(path, map_location, source, mmap), 'sharded'
    head = b''
    if osp.isfile(path):
        with open(path, 'rb') as f:
            head = f.read(16)
    # A safetensors header length can start with byte 0x80 (a 128..255-byte header), which is
    # also a pickle's first byte: test for the safetensors layout (length + '{') first.
    is_safetensors = _looks_like_safetensors(head, osp.getsize(path)) if head else False
    is_torch = not is_safetensors and (head.startswith(b'PK\x03\x04') or head[:1] == b'\x80')
    if is_safetensors or (not is_torch and name.endswith('.safetensors')):
        return load_safetensors_file(path, map_location, source, mmap), 'safetensors'
    obj = _load_torch_file(path, map_location, source, mmap)
    return obj, ('bin' if name.endswith('.bin') else 'torch')


def resolve_hub_cache_dir(path: str, source: Optional[str] = None) -> str:
    """A HuggingFace hub cache entry (``models--org--name``, holding ``refs/`` and
    ``snapshots/``) -> its snapshot directory: the revision ``refs/main`` names, else the only
    snapshot. Other paths are returned unchanged. Never touches the network."""
    source = source or path
    snapshots = osp.join(path, 'snapshots')
    if not osp.isdir(snapshots):
        return path
    ref = osp.join(path, 'refs', 'main')
    if osp.isfile(ref):
        with open(ref, 'r', encoding='utf-8') as f:
            revision = f.read().strip()
        snap = osp.join(snapshots, revision)
        if not osp.isdir(snap):
            raise CheckpointNotFoundError(source, f'its refs/main names revision {revision!r}, '
                                          f'which is not in {snapshots} (an incomplete '
                                          f'download?)')
        return snap
    revisions = sorted(d for d in os.listdir(snapshots) if osp.isdir(osp.join(snapshots, d)))
    if len(revisions) == 1:
        return osp.join(snapshots, revisions[0])
    what = 'no snapshot' if not revisions else f'{len(revisions)} snapshots ({revisions[:3]})'
    raise CheckpointError(source, 'not a checkpoint' if not revisions else 'missing',
                          f'a hub cache entry with {what} and no refs/main: point at '
                          f'{snapshots}/<revision> instead')


def snapshot_weights(directory: str, source: Optional[str] = None) -> str:
    """The weights file of a snapshot directory: the first of :data:`SNAPSHOT_WEIGHTS` there,
    else its only ``.safetensors`` / ``.bin`` / ``.pth`` / ``.pt`` file."""
    source = source or directory
    for name in SNAPSHOT_WEIGHTS:
        if osp.lexists(osp.join(directory, name)):
            return osp.join(directory, name)
    candidates = sorted(n for n in os.listdir(directory)
                        if n.endswith(_WEIGHT_SUFFIXES + ('.index.json', )))
    if len(candidates) == 1:
        return osp.join(directory, candidates[0])
    if candidates:
        raise CheckpointError(source, 'not a checkpoint', f'a directory with several weight '
                              f'files ({", ".join(candidates[:5])}): name the one to load')
    raise CheckpointError(source, 'not a checkpoint', 'a directory without model weights '
                          f'(expected one of {", ".join(SNAPSHOT_WEIGHTS)}, as in a '
                          'HuggingFace snapshot)')


def _checkpoint_path(checkpoint) -> str:
    if isinstance(checkpoint, os.PathLike):
        checkpoint = os.fspath(checkpoint)
    if not isinstance(checkpoint, str):
        raise TypeError(f'checkpoint must be a path or URL string, got {type(checkpoint).__name__}')
    if '://' in checkpoint and not checkpoint.startswith(_URL_PREFIXES):
        raise CheckpointError(checkpoint, 'unreachable', 'only local paths and http(s) URLs '
                              'are read here; other schemes (open-mmlab://, s3://, ...) are '
                              "MMEngine's: build the backbone from a config (mmvitswin's "
                              'registered classes read them through MMEngine)')
    return checkpoint


def read_checkpoint(checkpoint: str, map_location='cpu', mmap: bool = False) -> Checkpoint:
    """Read a checkpoint from a local path (file or HuggingFace snapshot / hub cache
    directory, see the module docstring) or an http(s) URL; nothing is unpickled beyond the
    weights-only allow-list. ``mmap``: the tensors stay in the memory-mapped file(s) until
    read (safetensors and zip checkpoints; for loading shards of a model, docs/fsdp.md).

    Every failure is one error naming the path and the cause: :class:`CheckpointError`
    ('missing' as :class:`CheckpointNotFoundError`, 'damaged', 'not a checkpoint',
    'unreachable') or :class:`UntrustedCheckpointError` (pickled objects outside the
    allow-list; nothing of them is executed).
    """
    checkpoint = _checkpoint_path(checkpoint)
    if checkpoint.startswith(_URL_PREFIXES):
        path = fetch_checkpoint(checkpoint)
        obj, kind = _load_weights_file(path, map_location, checkpoint, mmap)
        return Checkpoint(obj, None, checkpoint, kind)
    path = osp.expanduser(checkpoint)
    if osp.isdir(path):
        snapshot = resolve_hub_cache_dir(path, checkpoint)
        weights = snapshot_weights(snapshot, checkpoint)
        config = osp.join(snapshot, 'config.json')
        config = _read_json(config, checkpoint, 'its config') if osp.isfile(config) else None
        # errors name the weights file (inside the directory given, so that too)
        source = weights if osp.abspath(weights).startswith(osp.abspath(path)) else \
            f'{checkpoint} ({weights})'
        obj = _load_weights_file(weights, map_location, source, mmap)[0]
        return Checkpoint(obj, config, checkpoint, 'hf-snapshot')
    obj, kind = _load_weights_file(path, map_location, checkpoint, mmap)
    config = _config_beside(path, checkpoint) if kind != 'torch' else None
    return Checkpoint(obj, config, checkpoint, kind)


def load_checkpoint_file(checkpoint: str, map_location='cpu') -> dict:
    """The dict a checkpoint holds (:func:`read_checkpoint` without the config): any
    supported file or snapshot directory, local path or http(s) URL, weights-only."""
    return read_checkpoint(checkpoint, map_location=map_location).obj

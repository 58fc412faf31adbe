"""Crash-safe checkpoints for MMEngine runners: nothing half-written, ``--resume`` always works.

MMEngine 0.10.7 writes a checkpoint in place (``open(path, 'wb')``), writes ``last_checkpoint``
in place, and -- with ``max_keep_ckpts`` -- deletes the oldest checkpoint *before* writing the
new one. A run killed (SIGKILL, OOM killer, preemption) or interrupted (Ctrl-C) while saving can
therefore leave a truncated ``iter_N.pth`` and a ``last_checkpoint`` that names a file already
deleted, and ``--resume`` then fails.

:func:`install_atomic_checkpoints` (run when :mod:`mmvitswin` is imported, so every runner built
from a config with ``custom_imports=['mmvitswin']`` or by our tools gets it) changes that:

1. **Atomic checkpoint files.** The runner's ``save_checkpoint`` writes local files to a hidden
   temporary file in the same directory (``.iter_N.pth.tmp-<pid>``), flushes and fsyncs it, and
   renames it over the final name with ``os.replace``. A file under a checkpoint name is always
   complete; an interrupted save leaves at most the temporary file (removed on Ctrl-C and on any
   exception, left behind only by SIGKILL, and cleaned up by the next save of that name).
   Remote backends (``s3://`` ...) are left to MMEngine.
2. **Atomic ``last_checkpoint``.** The pointer file is written the same way.
3. **Deletion after success.** ``CheckpointHook`` removes checkpoints beyond ``max_keep_ckpts``
   only after the new checkpoint and ``last_checkpoint`` are in place.
4. **Resume falls back.** ``--resume`` (``resume=True`` without ``load_from``) takes the file
   named by ``last_checkpoint`` only when it is a complete checkpoint; otherwise the newest
   complete ``*.pth`` in the work dir, with a warning saying why.
"""
import builtins
import contextlib
import glob
import os
import os.path as osp
from typing import Callable, List, Optional

import torch

_installed = False
_TMP_MARK = '.tmp-'


def _serialize(obj, f) -> None:
    """Write ``obj`` to the open binary file ``f`` (a seam for tests that slow saving down)."""
    torch.save(obj, f)


def _tmp_path(path: str) -> str:
    head, tail = osp.split(path)
    return osp.join(head, f'.{tail}{_TMP_MARK}{os.getpid()}')


def _remove_stale_tmp(path: str) -> None:
    """Temporary files of ``path`` left by killed processes (not ours, not alive)."""
    head, tail = osp.split(path)
    for tmp in glob.glob(osp.join(glob.escape(head or '.'), f'.{glob.escape(tail)}{_TMP_MARK}*')):
        try:
            pid = int(tmp.rsplit(_TMP_MARK, 1)[1])
        except ValueError:
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # a live process may still be writing it
        except ProcessLookupError:
            pass
        except OSError:
            continue
        with contextlib.suppress(OSError):
            os.remove(tmp)


def atomic_write(path: str, write: Callable, mode: str = 'wb') -> None:
    """Create or replace ``path`` with what ``write(f)`` writes, atomically.

    The data goes to a temporary file beside ``path``, is flushed and fsynced, and is renamed
    over ``path``; on any exception (KeyboardInterrupt included) the temporary file is removed
    and ``path`` is untouched.
    """
    path = osp.abspath(path)
    os.makedirs(osp.dirname(path), exist_ok=True)
    _remove_stale_tmp(path)
    tmp = _tmp_path(path)
    try:
        with builtins.open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    # make the rename itself durable
    with contextlib.suppress(OSError):
        fd = os.open(osp.dirname(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_checkpoint_atomic(checkpoint: dict, filename: str, file_client_args=None,
                           backend_args=None) -> None:
    """``mmengine.runner.checkpoint.save_checkpoint`` with atomic local files (see above)."""
    from mmengine.fileio import LocalBackend, get_file_backend
    if file_client_args is None and isinstance(filename, str) and '://' not in filename:
        backend = get_file_backend(filename, backend_args=backend_args)
        if isinstance(backend, LocalBackend):
            atomic_write(filename, lambda f: _serialize(checkpoint, f))
            return
    _ORIGINAL['save_checkpoint'](checkpoint, filename, file_client_args=file_client_args,
                                 backend_args=backend_args)


class _AtomicTextFile:
    """What ``open(path, 'w')`` returns for ``last_checkpoint``: text gathered, then written
    atomically when the ``with`` block ends without an exception."""

    def __init__(self, path: str):
        self.path = path
        self.parts: List[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            data = ''.join(self.parts)
            atomic_write(self.path, lambda f: f.write(data), mode='w')
        return False


def _hook_open(file, mode='r', *args, **kwargs):
    """``open`` as seen by mmengine's checkpoint_hook module: its ``last_checkpoint`` write
    becomes atomic, everything else is the builtin."""
    if isinstance(file, str) and mode == 'w' and osp.basename(file) == 'last_checkpoint' \
            and not args and not kwargs:
        return _AtomicTextFile(file)
    return builtins.open(file, mode, *args, **kwargs)


class _DeferRemoval:
    """File-backend proxy that records removals instead of doing them (see item 3 above)."""

    def __init__(self, backend):
        self._backend = backend
        self.pending: List[tuple] = []

    def remove(self, path):
        self.pending.append(('remove', path))

    def rmtree(self, path):
        self.pending.append(('rmtree', path))

    def __getattr__(self, name):
        return getattr(self._backend, name)


def _save_checkpoint_with_step(self, runner, step, meta):
    """CheckpointHook's method, with old checkpoints removed only after the new one is saved."""
    backend = self.file_backend
    proxy = _DeferRemoval(backend)
    self.file_backend = proxy
    try:
        _ORIGINAL['_save_checkpoint_with_step'](self, runner, step, meta)
    finally:
        self.file_backend = backend
    for op, path in proxy.pending:
        with contextlib.suppress(FileNotFoundError):
            getattr(backend, op)(path)


# ------------------------------------------------------------------------------- resume
def is_complete_checkpoint(path: str) -> Optional[str]:
    """None when ``path`` is a complete checkpoint file, else why not (one short phrase)."""
    from ...core.checkpoint.loading import CheckpointError, check_checkpoint_file
    try:
        check_checkpoint_file(path)
    except CheckpointError as exc:
        return f'{exc.cause}: {str(exc).split("): ", 1)[-1]}'
    return None


def find_latest_complete_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint ``--resume`` should continue from in ``work_dir``.

    ``last_checkpoint``'s target when it is complete; else the newest complete ``*.pth`` in
    ``work_dir`` (a warning names the skipped file and why); None when there is none.
    """
    from mmengine.logging import print_log
    pointer = osp.join(work_dir, 'last_checkpoint')
    named = None
    if osp.isfile(pointer):
        with builtins.open(pointer) as f:
            named = f.read().strip() or None
    if named is not None and '://' in named:
        return named  # remote backend: MMEngine's business
    if named is not None:
        problem = is_complete_checkpoint(named)
        if problem is None:
            return named
        why = f'last_checkpoint names {named}, which is not usable ({problem})'
    else:
        why = ('last_checkpoint is empty' if osp.isfile(pointer) else
               'no last_checkpoint file')
    candidates = sorted(glob.glob(osp.join(glob.escape(work_dir), '*.pth')),
                        key=lambda p: osp.getmtime(p), reverse=True)
    for path in candidates:
        if is_complete_checkpoint(path) is None:
            print_log(f'resume: {why}; resuming from the newest complete checkpoint {path}',
                      logger='current', level=30)
            return path
    if named is not None or candidates:
        print_log(f'resume: {why}, and no complete checkpoint is left in {work_dir}; '
                  'training starts from the beginning', logger='current', level=30)
    return None


_ORIGINAL: dict = {}


def install_atomic_checkpoints() -> None:
    """Patch MMEngine's checkpoint writing and resume lookup as described above. Idempotent."""
    global _installed
    if _installed:
        return
    import importlib

    import mmengine.hooks.checkpoint_hook as hook_module
    import mmengine.runner as runner_package
    import mmengine.runner.checkpoint as ckpt_module
    import mmengine.runner.runner as runner_module
    from mmengine.hooks import CheckpointHook

    _ORIGINAL['save_checkpoint'] = ckpt_module.save_checkpoint
    _ORIGINAL['_save_checkpoint_with_step'] = CheckpointHook._save_checkpoint_with_step
    modules = [ckpt_module, runner_module, runner_package]
    try:
        modules.append(importlib.import_module('mmengine.runner._flexible_runner'))
    except ImportError:
        pass
    for module in modules:
        if hasattr(module, 'save_checkpoint'):
            module.save_checkpoint = save_checkpoint_atomic
        if hasattr(module, 'find_latest_checkpoint'):
            module.find_latest_checkpoint = find_latest_complete_checkpoint
    hook_module.open = _hook_open
    CheckpointHook._save_checkpoint_with_step = _save_checkpoint_with_step
    _installed = True

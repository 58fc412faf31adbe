"""Crash-safe checkpoint files: nothing half-written, ``--resume`` always finds a usable file.

MMEngine 0.10.7 writes a checkpoint in place (``open(path, 'wb')``), writes ``last_checkpoint``
in place, and -- with ``max_keep_ckpts`` -- deletes the oldest checkpoint *before* writing the
new one. A run killed (SIGKILL, OOM killer, preemption) or interrupted (Ctrl-C) while saving can
therefore leave a truncated ``iter_N.pth`` and a ``last_checkpoint`` that names a file already
deleted, and ``--resume`` then fails.

The pieces here, selected by our configs and tools (nothing of MMEngine is replaced):

1. :func:`atomic_write`: a file is written under a hidden temporary name in the same directory
   (``.iter_N.pth.tmp-<pid>``), flushed, fsynced and renamed over the final name with
   ``os.replace``. A file under a checkpoint name is always complete; an interrupted save leaves
   at most the temporary file (removed on Ctrl-C and on any exception, left behind only by
   SIGKILL, and cleaned up by the next save of that name).
   :class:`~mmvitswin.openmmlab.engine.runner.SafeCheckpointRunner` saves every local
   checkpoint this way (remote backends, ``s3://`` ..., are left to MMEngine).
2. :class:`AtomicCheckpointHook`: MMEngine's ``CheckpointHook`` with ``last_checkpoint`` written
   atomically, and checkpoints beyond ``max_keep_ckpts`` removed only *after* the new
   checkpoint and ``last_checkpoint`` are in place.
3. :func:`find_latest_complete_checkpoint`: what ``--resume`` continues from: the file named by
   ``last_checkpoint`` when it is a complete checkpoint, else the newest complete ``*.pth`` in
   the work dir, with a warning saying why (``SafeCheckpointRunner.load_or_resume``).
"""
import contextlib
import glob
import os
import os.path as osp
import shutil
from typing import Callable, Optional

from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log

from ..registry import HOOKS
from ...core.checkpoint.files import CheckpointError, check_checkpoint_file

_TMP_MARK = '.tmp-'
POINTER_FILE = 'last_checkpoint'
# A sharded checkpoint (engine/fsdp.py) is a directory: torch.distributed.checkpoint's shards
# and METADATA (written last), and the runner state beside them.
METADATA = '.metadata'
RUNNER_STATE = 'runner.pth'


# -------------------------------------------------------------------------- atomic files
def _tmp_path(path: str) -> str:
    head, tail = osp.split(path)
    return osp.join(head, f'.{tail}{_TMP_MARK}{os.getpid()}')


def _remove_stale_tmp(path: str) -> None:
    """Temporary files (or sharded-checkpoint directories) of ``path`` left by killed
    processes (not ours, not alive); the pid ends their name (``.tmp-<pid>``,
    ``.tmp-old-<pid>``)."""
    head, tail = osp.split(path)
    for tmp in glob.glob(osp.join(glob.escape(head or '.'), f'.{glob.escape(tail)}{_TMP_MARK}*')):
        try:
            pid = int(tmp.rsplit(_TMP_MARK, 1)[1].rsplit('-', 1)[-1])
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
        if osp.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Create or replace the file ``path`` with the file ``write(tmp_path)`` creates, atomically.

    ``write`` gets a temporary path beside ``path`` (same directory, so the rename cannot cross
    file systems). The file it leaves there is fsynced and renamed over ``path``; on any
    exception (KeyboardInterrupt included) the temporary file is removed and ``path`` is
    untouched.
    """
    path = osp.abspath(path)
    os.makedirs(osp.dirname(path), exist_ok=True)
    _remove_stale_tmp(path)
    tmp = _tmp_path(path)
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        _fsync(osp.dirname(path))


def atomic_write_text(path: str, text: str) -> None:
    """:func:`atomic_write` of a small text file (``last_checkpoint``)."""

    def write(tmp: str) -> None:
        with open(tmp, 'w') as f:
            f.write(text)

    atomic_write(path, write)


# -------------------------------------------------------------------------------- saving
@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` (same arguments) whose saves cannot leave ``--resume`` without a file.

    Differences from MMEngine's, in :meth:`_save_checkpoint_with_step` only:
    ``last_checkpoint`` is written atomically (:func:`atomic_write_text`), and the checkpoint
    that ``max_keep_ckpts`` retires is removed after the new one and ``last_checkpoint`` are
    in place, not before. The checkpoint file itself is written by the runner: atomically by
    :class:`~mmvitswin.openmmlab.engine.runner.SafeCheckpointRunner` (our configs' and tools'
    runner, which also puts this hook in place of a plain ``CheckpointHook``).
    """

    def _retire_oldest(self, runner, step: int) -> Optional[str]:
        """MMEngine's ``max_keep_ckpts`` bookkeeping; returns the checkpoint to remove after
        the save of ``step`` (None: nothing to remove)."""
        if self.max_keep_ckpts <= 0:
            return None
        # _save_checkpoint and _save_best_checkpoint may both save this step
        if len(self.keep_ckpt_ids) > 0 and self.keep_ckpt_ids[-1] == step:
            return None
        retired = None
        if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
            oldest = self.keep_ckpt_ids.popleft()
            retired = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(oldest))
        self.keep_ckpt_ids.append(step)
        runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))
        return retired

    def _save_checkpoint_with_step(self, runner, step, meta):
        retired = self._retire_oldest(runner, step)
        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            ckpt_filename,
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args)
        if not is_main_process():
            return
        atomic_write_text(osp.join(runner.work_dir, POINTER_FILE), self.last_ckpt)
        if retired is None or retired == self.last_ckpt:
            return
        with contextlib.suppress(FileNotFoundError):
            if self.file_backend.isfile(retired):
                self.file_backend.remove(retired)
            elif self.file_backend.isdir(retired):  # checkpoints saved by deepspeed
                self.file_backend.rmtree(retired)


# -------------------------------------------------------------------------------- resume
def is_sharded_checkpoint(path: str) -> bool:
    """A complete sharded checkpoint directory (saved by ``FSDP2Strategy``)."""
    return osp.isdir(path) and all(
        osp.isfile(osp.join(path, name)) for name in (METADATA, RUNNER_STATE))


def is_complete_checkpoint(path: str) -> Optional[str]:
    """None when ``path`` is a complete checkpoint file (or sharded checkpoint directory), else
    why not (one short phrase)."""
    if osp.isdir(path):
        return None if is_sharded_checkpoint(path) else (
            f'a directory without {METADATA} and {RUNNER_STATE}')
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
    pointer = osp.join(work_dir, POINTER_FILE)
    named = None
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip() or None
    if named is not None and '://' in named:
        return named  # remote backend: MMEngine's business
    if named is not None:
        problem = is_complete_checkpoint(named)
        if problem is None:
            return named
        why = f'{POINTER_FILE} names {named}, which is not usable ({problem})'
    else:
        why = f'{POINTER_FILE} is empty' if osp.isfile(pointer) else f'no {POINTER_FILE} file'
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

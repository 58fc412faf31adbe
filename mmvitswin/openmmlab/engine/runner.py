"""The runner of our configs and tools: MMEngine's ``Runner`` with safe checkpoints.

``runner_type = 'mmvitswin.SafeCheckpointRunner'`` in a config (our ``configs/_base_`` and
``configs/demo`` set it; ``tools/train.py``, ``tools/test.py`` and ``tools/demo.py`` choose it for
a config that names no runner) gives:

- **weights-only loading**: ``--resume`` and ``load_from`` read runner checkpoints with torch's
  weights-only unpickler and the runner's allow-list
  (:func:`~mmvitswin.openmmlab.engine.safe_load.load_runner_checkpoint`), so they work under
  torch >= 2.6 (MMEngine 0.10.7's own loader raises ``UnpicklingError`` there) and never run
  code pickled into a file;
- **atomic checkpoint files**: every local checkpoint is written to a temporary file and renamed
  over its name (:func:`~mmvitswin.openmmlab.engine.checkpoint_io.atomic_write`), and a plain
  ``CheckpointHook`` in ``default_hooks`` becomes
  :class:`~mmvitswin.openmmlab.engine.checkpoint_io.AtomicCheckpointHook`;
- **resume that falls back**: ``--resume`` without a path continues from the newest *complete*
  checkpoint (:func:`~mmvitswin.openmmlab.engine.checkpoint_io.find_latest_complete_checkpoint`).

Everything else is MMEngine's ``Runner``.
"""
import os.path as osp
from typing import Callable, Dict, Optional, Union

from mmengine.dist import master_only
from mmengine.fileio import LocalBackend, get_file_backend
from mmengine.hooks import CheckpointHook, Hook
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner
from mmengine.runner.checkpoint import _load_checkpoint_to_model

from ..registry import RUNNERS
from .checkpoint_io import AtomicCheckpointHook, atomic_write, find_latest_complete_checkpoint
from .safe_load import load_runner_checkpoint


def _is_plain_checkpoint_hook(hook) -> bool:
    """A ``default_hooks.checkpoint`` entry that names MMEngine's ``CheckpointHook`` itself."""
    if not isinstance(hook, dict):
        return False
    kind = hook.get('type')
    if isinstance(kind, str):
        return kind.split('.')[-1] == 'CheckpointHook'
    return kind is CheckpointHook


@RUNNERS.register_module()
class SafeCheckpointRunner(Runner):
    """MMEngine's ``Runner`` with weights-only loading, atomic checkpoint files and a resume
    that falls back to the newest complete checkpoint (module docstring). Same arguments."""

    # ------------------------------------------------------------------------------ loading
    def load_checkpoint(self, filename: str, map_location: Union[str, Callable] = 'cpu',
                        strict: bool = False, revise_keys: list = [(r'^module.', '')]):
        """``Runner.load_checkpoint`` (also what ``resume`` reads with), the file read by
        :func:`~mmvitswin.openmmlab.engine.safe_load.load_runner_checkpoint`."""
        checkpoint = load_runner_checkpoint(filename, map_location=map_location)
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = self.model.module if is_model_wrapper(self.model) else self.model
        checkpoint = _load_checkpoint_to_model(model, checkpoint, strict, revise_keys=revise_keys)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint

    def load_or_resume(self) -> None:
        """``--resume`` without a path: the newest complete checkpoint of the work dir (MMEngine
        would take whatever ``last_checkpoint`` names, complete or not)."""
        if not self._has_loaded and self._resume and self._load_from is None:
            latest = find_latest_complete_checkpoint(self.work_dir)
            if latest is None:
                self.logger.info(f'resume: no checkpoint in {self.work_dir}; training starts '
                                 'from the beginning')
                return
            self.logger.info(f'Auto resumed from the latest checkpoint {latest}.')
            self.resume(latest)
            return
        super().load_or_resume()

    # ------------------------------------------------------------------------------- saving
    @master_only
    def save_checkpoint(self, out_dir: str, filename: str,
                        file_client_args: Optional[dict] = None, save_optimizer: bool = True,
                        save_param_scheduler: bool = True, meta: Optional[dict] = None,
                        by_epoch: bool = True, backend_args: Optional[dict] = None):
        """``Runner.save_checkpoint``; a local file is written atomically (the checkpoint is
        complete under its name or not there). Remote backends are MMEngine's."""
        save = super().save_checkpoint
        options = dict(save_optimizer=save_optimizer, save_param_scheduler=save_param_scheduler,
                       meta=meta, by_epoch=by_epoch)
        local = file_client_args is None and '://' not in str(out_dir) and isinstance(
            get_file_backend(out_dir, backend_args=backend_args), LocalBackend)
        if not local:
            return save(out_dir, filename, file_client_args, backend_args=backend_args,
                        **options)
        atomic_write(osp.join(out_dir, filename),
                     lambda tmp: save(osp.dirname(tmp), osp.basename(tmp),
                                      backend_args=backend_args, **options))

    def register_default_hooks(self, hooks: Optional[Dict[str, Union[Hook, Dict]]] = None
                               ) -> None:
        """MMEngine's default hooks, with :class:`AtomicCheckpointHook` for a plain
        ``CheckpointHook`` (MMEngine's default one included); its arguments are kept."""
        hooks = dict(hooks) if hooks is not None else {}
        checkpoint = hooks.get('checkpoint', dict(type='CheckpointHook', interval=1))
        if _is_plain_checkpoint_hook(checkpoint):
            hooks['checkpoint'] = dict(checkpoint, type=AtomicCheckpointHook)
        super().register_default_hooks(hooks)

"""Safe checkpoint loading: runner checkpoints load, anything else is refused clearly.

The loader is :func:`mmvitswin.openmmlab.engine.safe_load.load_runner_checkpoint`, what our
SafeCheckpointRunner reads ``--resume`` and ``load_from`` with (MMEngine's own loaders and
torch's process-wide allow-list are not changed: tests/test_no_patches.py).

On torch < 2.6 there is no usable allow-list and loading is MMEngine's own full pickle: the
weights-only tests skip there and ``test_old_torch_loads_like_mmengine`` pins that behaviour.
"""
import os
import pickle

import numpy as np
import pytest
import torch
from conftest import requires_torch

from mmvitswin.core import compat

# torch >= 2.6: add_safe_globals with (obj, 'module.name') entries; see mmvitswin.core.compat
requires_allow_list = requires_torch((2, 6), 'weights-only loading with an allow-list')

MARKER_ENV = 'A1_SAFE_LOAD_MARKER'


def _side_effect(path):
    """What a malicious checkpoint would do on load: here, just create a file."""
    with open(path, 'w') as f:
        f.write('code ran')
    return {}


class Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return _side_effect, (self.path, )


def globals_in_checkpoint(path):
    """Every non-default global a checkpoint pickles (ignoring any allow-list in effect).

    Needs torch >= 2.5 (``get_unsafe_globals_in_checkpoint``)."""
    saved = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        return set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    finally:
        torch.serialization.add_safe_globals(saved)


def _runner_like_checkpoint():
    """What MMEngine's runner saves besides tensors (see CheckpointHook/Runner.save_checkpoint)."""
    from mmengine.logging import MessageHub
    hub = MessageHub.get_instance('a1_safe_load_test')
    for i in range(3):
        hub.update_scalar('train/loss', float(np.float64(1.0 / (i + 1))))
    hub.update_info('best_score', np.float64(0.5))
    hub.update_info('shape', np.zeros((2, 3), dtype=np.int32))
    return dict(
        meta=dict(epoch=1, iter=2, cfg='model = dict()', seed=0, mmengine_version='0.10.7',
                  dataset_meta=dict(classes=('a', 'b'), palette=[(1, 2, 3), (4, 5, 6)])),
        state_dict={'w': torch.ones(2)},
        message_hub=hub.state_dict(),
        optimizer=dict(state={0: dict(step=torch.tensor(2.), exp_avg=torch.zeros(2))},
                       param_groups=[dict(lr=1e-4, betas=(0.9, 0.999), params=[0])]),
        param_schedulers=[dict(last_step=2, by_epoch=False, base_values=[1e-4])])


def test_runner_checkpoint_loads(tmp_path, monkeypatch):
    """Every torch: a runner checkpoint round-trips through our runner's loader."""
    from mmvitswin.openmmlab.engine.safe_load import load_runner_checkpoint
    monkeypatch.delenv('MMVITSWIN_TRUST_CHECKPOINTS', raising=False)
    path = str(tmp_path / 'runner.pth')
    torch.save(_runner_like_checkpoint(), path)
    ckpt = load_runner_checkpoint(path, map_location='cpu')  # SafeCheckpointRunner's resume
    hub = ckpt['message_hub']
    assert hub['log_scalars']['train/loss'].mean() == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert hub['runtime_info']['best_score'] == 0.5
    assert hub['runtime_info']['shape'].dtype == np.int32
    assert ckpt['meta']['dataset_meta']['palette'] == [(1, 2, 3), (4, 5, 6)]
    if compat.WEIGHTS_ONLY_DEFAULT:  # and torch's own default stays as strict as it was
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path, map_location='cpu')


@requires_allow_list
def test_runner_checkpoint_needs_only_allow_listed_globals(tmp_path, monkeypatch):
    from mmvitswin.openmmlab.engine.safe_load import (WEIGHTS_ONLY_LOADING, allowed_names,
                                                      safe_torch_load)
    assert WEIGHTS_ONLY_LOADING
    path = str(tmp_path / 'runner.pth')
    torch.save(_runner_like_checkpoint(), path)
    unsafe = globals_in_checkpoint(path)
    assert {'mmengine.logging.history_buffer.HistoryBuffer', 'builtins.getattr'} <= unsafe
    assert unsafe <= allowed_names()
    # and the weights-only unpickler, given the allow-list for this call, rebuilds it
    assert safe_torch_load(path, map_location='cpu')['meta']['epoch'] == 1


@pytest.mark.skipif(compat.HAS_SAFE_GLOBAL_ALIASES, reason='torch >= 2.6 refuses instead')
def test_old_torch_loads_like_mmengine(tmp_path, monkeypatch):
    """torch < 2.6: no allow-list, so loading is MMEngine's full pickle (documented as unsafe
    for untrusted files): nothing is refused and the file's code does run."""
    from mmvitswin.openmmlab.engine.safe_load import (WEIGHTS_ONLY_LOADING, check_trusted,
                                                      load_runner_checkpoint)
    monkeypatch.delenv('MMVITSWIN_TRUST_CHECKPOINTS', raising=False)
    assert not WEIGHTS_ONLY_LOADING and not compat.WEIGHTS_ONLY_DEFAULT
    assert compat.add_safe_globals([Payload]) is False
    marker = tmp_path / 'marker'
    path = str(tmp_path / 'evil.pth')
    ckpt = _runner_like_checkpoint()
    ckpt['meta']['hook_msgs'] = Payload(str(marker))
    torch.save(ckpt, path)
    check_trusted(path)  # no refusal on this torch
    loaded = load_runner_checkpoint(path, map_location='cpu')
    assert marker.read_text() == 'code ran' and loaded['meta']['iter'] == 2


@requires_allow_list
def test_disallowed_object_is_refused_with_instructions(tmp_path, monkeypatch):
    from mmvitswin.core.checkpoint import UntrustedCheckpointError
    from mmvitswin.openmmlab.engine.safe_load import load_runner_checkpoint
    monkeypatch.delenv('MMVITSWIN_TRUST_CHECKPOINTS', raising=False)
    marker = tmp_path / 'marker'
    path = str(tmp_path / 'evil.pth')
    ckpt = _runner_like_checkpoint()
    ckpt['meta']['hook_msgs'] = Payload(str(marker))
    torch.save(ckpt, path)
    with pytest.raises(UntrustedCheckpointError) as info:
        load_runner_checkpoint(path, map_location='cpu')
    msg = str(info.value)
    assert path in msg
    assert f'{__name__}._side_effect' in msg  # names the offending global
    assert 'MMVITSWIN_TRUST_CHECKPOINTS=1' in msg  # and how to load a trusted file
    assert not marker.exists()
    # explicit opt-in: the user trusts the file, so it is unpickled in full (code runs)
    monkeypatch.setenv('MMVITSWIN_TRUST_CHECKPOINTS', '1')
    loaded = load_runner_checkpoint(path, map_location='cpu')
    assert marker.read_text() == 'code ran' and loaded['meta']['iter'] == 2


@requires_allow_list
def test_getattr_stand_in_only_reaches_history_buffer_methods(tmp_path, monkeypatch):
    """A pickled getattr(np.ndarray, '__class__')-style walk must not get through."""
    from mmvitswin.core.checkpoint import UntrustedCheckpointError
    from mmvitswin.openmmlab.engine.safe_load import load_runner_checkpoint
    monkeypatch.delenv('MMVITSWIN_TRUST_CHECKPOINTS', raising=False)

    class Sneaky:
        def __reduce__(self):
            return getattr, (np.ndarray, '__subclasses__')

    path = str(tmp_path / 'sneaky.pth')
    torch.save({'x': Sneaky()}, path)
    with pytest.raises(UntrustedCheckpointError, match='only HistoryBuffer statistics'):
        load_runner_checkpoint(path, map_location='cpu')
    assert issubclass(UntrustedCheckpointError, pickle.UnpicklingError)


@requires_allow_list
def test_tools_report_untrusted_resume_checkpoint(tmp_path, monkeypatch, capsys):
    """--resume with a refused file: exit 2 and the explanation, no traceback."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location('a1_train_tool',
                                                  os.path.join(root, 'tools', 'train.py'))
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    monkeypatch.delenv('MMVITSWIN_TRUST_CHECKPOINTS', raising=False)
    path = str(tmp_path / 'evil.pth')
    torch.save({'state_dict': {'w': torch.ones(1)}, 'x': Payload(str(tmp_path / 'm'))}, path)
    cfg = tmp_path / 'toy.py'
    cfg.write_text(
        "custom_imports = dict(imports=['mmvitswin'], allow_failed_imports=False)\n"
        "model = dict(type='mmvitswin.SwinTransformer', arch='tiny', depths=[1, 1, 1, 1])\n")
    monkeypatch.chdir(tmp_path)
    assert train.main([str(cfg), '--resume', path, '--work-dir', str(tmp_path / 'wd')]) == 2
    err = capsys.readouterr().err
    assert 'Refusing to load checkpoint' in err and 'MMVITSWIN_TRUST_CHECKPOINTS=1' in err
    assert 'Traceback' not in err and not (tmp_path / 'm').exists()

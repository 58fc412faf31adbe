"""Issue 13, training runs: a run killed or interrupted while it saves loses nothing that
``--resume`` needs, a NaN loss stops the run naming the iteration, and ``with_cp`` trains under
DDP with frozen stages.

The subprocess tests run tools/train.py on the real UPerNet Swin-T config cut to one block per
stage, on tiny generated data (the config's runner is our SafeCheckpointRunner). Saving is
slowed down by a module the training process imports: it wraps MMEngine's
``LocalBackend.put`` (what writes checkpoint bytes) in that process only, to stand for a slow
disk. The fast tests train a toy model with SafeCheckpointRunner in this process.
"""
import os
import os.path as osp
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import mmvitswin  # noqa: F401
from mmvitswin.openmmlab.engine import checkpoint_io
from mmvitswin.openmmlab.engine.safe_load import safe_torch_load

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PY = sys.executable

SLOW_SAVE = '''
import os, time
from mmengine.fileio import LocalBackend

_put = LocalBackend.put


def _slow_put(self, obj, filepath):
    """For the checkpoint named in $A13_SLOW_SAVE: write half of it, say so, then stall."""
    target = os.environ.get('A13_SLOW_SAVE')
    if target and os.path.basename(str(filepath)).startswith('.' + target):
        with open(filepath, 'wb') as f:
            f.write(obj[:len(obj) // 2])
            f.flush()
        open(os.environ['A13_MARKER'], 'w').close()
        time.sleep(600)  # the test kills or interrupts us here
    _put(self, obj, filepath)


LocalBackend.put = _slow_put  # this test's stand-in for a slow disk, in the child only
'''

NAN_AT = '''
import os
import torch
from mmvitswin.core.backbones.swin import SwinTransformer

_forward = SwinTransformer.forward
_calls = [0]


def _forward_nan_at(self, x):
    """Training forward number $A13_NAN_AT (1-based) returns NaN features."""
    outs = _forward(self, x)
    if self.training:
        _calls[0] += 1
        if _calls[0] == int(os.environ.get('A13_NAN_AT', '0')):
            outs = tuple(o * float('nan') for o in outs)
    return outs


SwinTransformer.forward = _forward_nan_at
'''


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    from mmvitswin.openmmlab.datasets.shapes import make_shapes
    root = tmp_path_factory.mktemp('reliability')
    make_shapes(str(root / 'shapes'), num_train=4, num_val=2, image_size=(64, 64))
    (root / 'pkg').mkdir()
    (root / 'pkg' / 'a13_slow_save.py').write_text(SLOW_SAVE)
    (root / 'pkg' / 'a13_nan_at.py').write_text(NAN_AT)
    return root


def _env(work, **extra):
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([str(work / 'pkg'), ROOT, env.get('PYTHONPATH', '')])
    env['OMP_NUM_THREADS'] = '1'
    env.pop('MMVITSWIN_TRUST_CHECKPOINTS', None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _config(work, name, imports=(), extra=''):
    """UPerNet Swin-T (1 block per stage) on the tiny ADE-style shapes data; no custom_hooks
    override, so the config's own (the invalid-loss check) stay in."""
    path = work / f'{name}.py'
    path.write_text(textwrap.dedent(f'''\
        _base_ = {osp.join(ROOT, 'configs', 'upernet_swin_t_ade20k.py')!r}
        custom_imports = dict(imports={['mmvitswin', *imports]!r}, allow_failed_imports=False)
        data_root = {str(work / 'shapes' / 'ade')!r}
        crop_size = (64, 64)
        model = dict(
            data_preprocessor=dict(size=crop_size),
            backbone=dict(depths=[1, 1, 1, 1], init_cfg=None),
            decode_head=dict(channels=32), auxiliary_head=dict(channels=16))
        train_pipeline = [
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', reduce_zero_label=True),
            dict(type='RandomCrop', crop_size=crop_size),
            dict(type='PackSegInputs')]
        train_dataloader = dict(
            batch_size=2, num_workers=0, persistent_workers=False,
            dataset=dict(data_root=data_root, pipeline=train_pipeline))
        val_dataloader = dict(num_workers=0, persistent_workers=False,
                              dataset=dict(data_root=data_root))
        test_dataloader = val_dataloader
        train_cfg = dict(max_iters=4, val_interval=100)
        default_hooks = dict(logger=dict(interval=1),
                             checkpoint=dict(interval=2, max_keep_ckpts=1))
        ''') + extra)
    return str(path)


def _start(work, cfg, wd, *args, **env):
    # the child gets Ctrl-C's default disposition even if something in this test process has
    # set SIGINT to be ignored (an ignored signal is inherited, and Python keeps it ignored)
    return subprocess.Popen([PY, 'tools/train.py', cfg, '--work-dir', str(wd), *args],
                            cwd=ROOT, env=_env(work, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(proc, marker, timeout=300):
    deadline = time.time() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f'training exited early ({proc.returncode}):\n{proc.stdout.read()[-4000:]}')
        if time.time() > deadline:
            proc.kill()
            pytest.fail('training never reached the slowed-down save')
        time.sleep(0.3)


def _finish(proc, timeout=300):
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out


def _pointer(wd):
    return (wd / 'last_checkpoint').read_text().strip()


def _leftover_tmp(wd):
    return sorted(p.name for p in wd.iterdir() if checkpoint_io._TMP_MARK in p.name)


# --------------------------------------------------------------------- kill during save
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_killed_or_interrupted_while_saving_then_resumed(work):
    """max_keep_ckpts=1 is the worst case for MMEngine: it deletes iter_2.pth *before* writing
    iter_4.pth, so a crash in that write used to leave nothing to resume from."""
    wd = work / 'wd_kill'
    cfg = _config(work, 'kill', imports=['a13_slow_save'])

    # 1. SIGKILL half-way through writing iter_4.pth
    marker = work / 'stall_kill'
    proc = _start(work, cfg, wd, A13_SLOW_SAVE='iter_4.pth', A13_MARKER=marker)
    _wait_for(proc, marker)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    proc.stdout.close()
    assert not (wd / 'iter_4.pth').exists()  # nothing half-written under a checkpoint name
    assert (wd / 'iter_2.pth').exists()  # the old one is removed only after success
    assert _pointer(wd).endswith('iter_2.pth')
    assert checkpoint_io.is_complete_checkpoint(str(wd / 'iter_2.pth')) is None
    assert len(_leftover_tmp(wd)) == 1  # SIGKILL cannot clean up its temporary file ...

    # 2. --resume; Ctrl-C (SIGINT) half-way through writing iter_4.pth again
    marker = work / 'stall_int'
    proc = _start(work, cfg, wd, '--resume', A13_SLOW_SAVE='iter_4.pth', A13_MARKER=marker)
    _wait_for(proc, marker)
    proc.send_signal(signal.SIGINT)
    code, out = _finish(proc)
    assert code != 0 and 'KeyboardInterrupt' in out
    assert 'resumed epoch: 0, iter: 2' in out
    assert not (wd / 'iter_4.pth').exists() and (wd / 'iter_2.pth').exists()
    assert _leftover_tmp(wd) == []  # ... the interrupted save removed its own, and the stale one
    assert _pointer(wd).endswith('iter_2.pth')

    # 3. --resume continues from iteration 2 and completes
    proc = _start(work, cfg, wd, '--resume')
    code, out = _finish(proc)
    assert code == 0, out[-4000:]
    assert 'resumed epoch: 0, iter: 2' in out and 'Iter(train) [4/4]' in out
    assert (wd / 'iter_4.pth').exists() and not (wd / 'iter_2.pth').exists()
    assert _pointer(wd).endswith('iter_4.pth')
    assert safe_torch_load(str(wd / 'iter_4.pth'), map_location='cpu')['meta']['iter'] == 4


def test_atomic_write_keeps_old_file_on_interrupt(tmp_path):
    path = tmp_path / 'iter_2.pth'
    checkpoint_io.atomic_write(str(path), lambda tmp: torch.save({'w': torch.ones(3)}, tmp))

    def interrupted(tmp):
        with open(tmp, 'wb') as f:
            f.write(b'PK\x03\x04 half a checkpoint')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        checkpoint_io.atomic_write(str(path), interrupted)
    assert torch.equal(torch.load(path)['w'], torch.ones(3))  # old content intact
    assert [p.name for p in tmp_path.iterdir()] == ['iter_2.pth']  # no temporary file left


def test_resume_falls_back_to_newest_complete_checkpoint(tmp_path):
    wd = tmp_path
    torch.save({'meta': {'iter': 2}, 'state_dict': {'w': torch.ones(1)}}, wd / 'iter_2.pth')
    time.sleep(0.05)
    torch.save({'meta': {'iter': 4}, 'state_dict': {'w': torch.ones(1)}}, wd / 'iter_4.pth')
    data = (wd / 'iter_4.pth').read_bytes()
    (wd / 'iter_6.pth').write_bytes(data[:len(data) // 3])  # a non-atomic writer's leftover
    os.utime(wd / 'iter_6.pth')
    find = checkpoint_io.find_latest_complete_checkpoint
    (wd / 'last_checkpoint').write_text(str(wd / 'iter_6.pth'))
    assert find(str(wd)) == str(wd / 'iter_4.pth')  # pointer to a damaged file
    (wd / 'last_checkpoint').write_text(str(wd / 'iter_8.pth'))
    assert find(str(wd)) == str(wd / 'iter_4.pth')  # pointer to a deleted file
    (wd / 'last_checkpoint').write_text('')
    assert find(str(wd)) == str(wd / 'iter_4.pth')  # empty pointer
    (wd / 'last_checkpoint').write_text(str(wd / 'iter_2.pth'))
    assert find(str(wd)) == str(wd / 'iter_2.pth')  # a good pointer is obeyed
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert find(str(empty)) is None


# ------------------------------------------------- the runner, in process, on a toy model
class _Points(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.full((2, ), float(i))
        return dict(inputs=x, target=x.sum(dim=0, keepdim=True))


def _toy_runner(work_dir, resume=False, max_iters=4, checkpoint=None, load_from=None,
                custom_hooks=None):
    """SafeCheckpointRunner training a 2 -> 1 linear model by SGD (momentum: optimizer state)."""
    from mmengine.model import BaseModel
    from mmvitswin.openmmlab.engine.runner import SafeCheckpointRunner

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(2, 1)

        def forward(self, inputs, target, mode='loss'):
            return dict(loss=(self.fc(inputs) - target).square().mean())

    return SafeCheckpointRunner(
        model=Toy(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=_Points(), sampler=dict(type='DefaultSampler', shuffle=False),
                              batch_size=2, collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=checkpoint or dict(type='CheckpointHook', interval=2,
                                                         by_epoch=False, max_keep_ckpts=1)),
        custom_hooks=custom_hooks, resume=resume, load_from=load_from, default_scope='mmengine',
        experiment_name=f'toy_{os.path.basename(str(work_dir))}_{int(resume)}_{time.time_ns()}')


def test_runner_saves_atomically_and_resumes_weights_only(tmp_path):
    """The runner of our configs: a plain CheckpointHook becomes AtomicCheckpointHook, the
    retired checkpoint goes after the new one is in place, no temporary file stays, and
    --resume reads its own checkpoint (HistoryBuffer inside) weights-only under torch >= 2.6."""
    from mmvitswin.openmmlab.engine.checkpoint_io import AtomicCheckpointHook
    wd = tmp_path / 'wd'
    runner = _toy_runner(wd)
    assert [type(h) for h in runner.hooks if isinstance(h, AtomicCheckpointHook)] == \
        [AtomicCheckpointHook]
    runner.train()
    assert sorted(p.name for p in wd.iterdir() if p.suffix == '.pth') == ['iter_4.pth']
    assert _leftover_tmp(wd) == []
    assert _pointer(wd) == str(wd / 'iter_4.pth')
    saved = safe_torch_load(str(wd / 'iter_4.pth'), map_location='cpu')
    assert saved['meta']['iter'] == 4 and 'message_hub' in saved
    # resume (auto) continues from iteration 4 with the saved model and momentum buffers
    resumed = _toy_runner(wd, resume=True, max_iters=6)
    resumed.load_or_resume()
    assert resumed.iter == 4
    assert torch.equal(resumed.model.fc.weight, saved['state_dict']['fc.weight'])
    state = resumed.optim_wrapper.optimizer.state_dict()['state']
    assert torch.equal(state[0]['momentum_buffer'], saved['optimizer']['state'][0]['momentum_buffer'])


def test_failed_save_keeps_the_previous_checkpoint(tmp_path):
    """A save that dies (here: an exception while the checkpoint is written, as Ctrl-C would)
    leaves the previous checkpoint, the pointer to it and no temporary file: MMEngine's hook
    would already have deleted iter_2.pth (max_keep_ckpts=1)."""
    from mmengine.hooks import Hook

    class FailWhileSaving(Hook):
        def before_save_checkpoint(self, runner, checkpoint):
            if checkpoint['meta']['iter'] == 4:
                raise KeyboardInterrupt

    wd = tmp_path / 'wd'
    with pytest.raises(KeyboardInterrupt):
        _toy_runner(wd, custom_hooks=[FailWhileSaving()]).train()
    assert sorted(p.name for p in wd.iterdir() if p.suffix == '.pth') == ['iter_2.pth']
    assert _pointer(wd) == str(wd / 'iter_2.pth') and _leftover_tmp(wd) == []


def test_runner_resume_skips_a_half_written_checkpoint(tmp_path):
    """last_checkpoint naming a truncated file (a writer that was not atomic): --resume takes
    the newest complete one instead; MMEngine's own Runner would fail on it."""
    wd = tmp_path / 'wd'
    _toy_runner(wd, checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False)).train()
    data = (wd / 'iter_4.pth').read_bytes()
    (wd / 'iter_6.pth').write_bytes(data[:len(data) // 2])
    (wd / 'last_checkpoint').write_text(str(wd / 'iter_6.pth'))
    resumed = _toy_runner(wd, resume=True, max_iters=6)
    resumed.load_or_resume()
    assert resumed.iter == 4


def test_runner_load_from_damaged_file_names_it(tmp_path):
    from mmvitswin.core.checkpoint import CheckpointError
    bad = tmp_path / 'cut.pth'
    torch.save({'state_dict': {'fc.weight': torch.ones(1, 2)}}, bad)
    bad.write_bytes(bad.read_bytes()[:40])
    runner = _toy_runner(tmp_path / 'wd', load_from=str(bad))
    with pytest.raises(CheckpointError) as info:
        runner.load_or_resume()
    assert info.value.cause == 'damaged' and str(bad) in str(info.value)


# ------------------------------------------------------------------------- NaN loss stop
def test_configs_select_our_runner_and_hooks():
    from mmengine.config import Config
    for name in ('mask_rcnn_swin_t_coco.py', 'upernet_swin_t_ade20k.py',
                 'demo/mask_rcnn_swin_nano_shapes.py', 'demo/upernet_swin_nano_shapes.py',
                 'demo/mask_rcnn_vit_adapter_simple_shapes.py'):
        cfg = Config.fromfile(osp.join(ROOT, 'configs', name))
        assert cfg.runner_type == 'mmvitswin.SafeCheckpointRunner', name
        assert cfg.default_hooks.checkpoint.type == 'mmvitswin.AtomicCheckpointHook', name
        hooks = [h for h in cfg.get('custom_hooks', []) if h['type'] == 'mmvitswin.FiniteLossHook']
        assert hooks and hooks[0]['interval'] == 1, name


def test_invalid_loss_hook_message_names_iteration():
    from types import SimpleNamespace

    from mmvitswin.openmmlab.engine.invalid_loss import FiniteLossHook
    hook = FiniteLossHook(interval=1)
    runner = SimpleNamespace(iter=6, epoch=0)
    ok = dict(loss=torch.tensor(1.5), loss_cls=torch.tensor(1.0))
    hook.after_train_iter(runner, 0, outputs=ok)  # finite: nothing happens
    bad = dict(loss=torch.tensor(float('inf')), loss_cls=torch.tensor(1.0),
               loss_mask=torch.tensor(float('inf')))
    with pytest.raises(AssertionError, match=r'loss is inf at iteration 7 \(epoch 1\).*'
                                             r'loss_cls=1, loss_mask=inf'):
        hook.after_train_iter(runner, 0, outputs=bad)
    every_2 = FiniteLossHook(interval=2)
    every_2.after_train_iter(runner, 0, outputs=bad)  # iteration 7 is not checked
    with pytest.raises(AssertionError, match='iteration 8'):
        every_2.after_train_iter(SimpleNamespace(iter=7, epoch=0), 0, outputs=bad)
    with pytest.raises(ValueError, match='interval'):
        FiniteLossHook(interval=0)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_nan_loss_stops_training_naming_the_iteration(work):
    wd = work / 'wd_nan'
    cfg = _config(work, 'nan', imports=['a13_nan_at'])
    proc = _start(work, cfg, wd, A13_NAN_AT=2)
    code, out = _finish(proc)
    assert code != 0
    assert 'FiniteLossHook: the loss is nan at iteration 2' in out, out[-3000:]
    assert 'Iter(train) [3/4]' not in out  # it stopped there


# ------------------------------------------------------------------ with_cp + DDP + frozen
def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_with_cp_ddp_frozen_stages_trains(work):
    wd = work / 'wd_cp_ddp'
    extra = textwrap.dedent('''\
        model['backbone'].update(with_cp=True, frozen_stages=1)
        find_unused_parameters = True
        train_cfg = dict(max_iters=3, val_interval=100)
        default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=100))
        ''')
    cfg = _config(work, 'cp_ddp', extra=extra)
    proc = subprocess.run(['bash', 'tools/dist_train.sh', cfg, '2', '--work-dir', str(wd)],
                          cwd=ROOT, env=_env(work, PORT=_free_port(), PYTHON=PY),
                          capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert 'mark a variable ready only once' not in out
    assert 'Iter(train) [3/3]' in out and 'gloo' in out

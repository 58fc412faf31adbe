"""tools/train.py, tools/test.py, tools/dist_train.sh and --resume, on tiny generated data.

The real configs are used through small derived configs (``_base_`` = the real file) that point
at generated "shapes" data, cut the Swin to one block per stage and shrink the images. A probe
hook, imported by the training processes through ``custom_imports``, records what the runner
holds (fingerprints of model and optimizer tensors, iterations run) so the test can compare it
with the checkpoint files.
"""
import hashlib
import inspect
import json
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

pytestmark = [
    pytest.mark.slow(reason='trains/tests through tools/*.py, also two gloo processes'),
    pytest.mark.timeout(1200),
]

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PY = sys.executable
CLASSES = ('square', 'disc', 'triangle', 'star')


def fingerprint(obj):
    """Nested containers with every tensor replaced by (dtype, shape, sha256 of its bytes)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        return [str(t.dtype), list(t.shape), hashlib.sha256(t.numpy().tobytes()).hexdigest()]
    if isinstance(obj, dict):
        return {str(k): fingerprint(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [fingerprint(v) for v in obj]
    return obj


PROBE_HOOK = '''
import json, os, time
from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module(force=True)
class ProbeHook(Hook):
    """Records runner state for tests/test_train_tools.py; can stall after an iteration."""
    priority = 'LOWEST'  # after CheckpointHook: a checkpoint of this iteration exists

    def __init__(self, out_dir, stall_after_iter=-1):
        self.out_dir = out_dir
        self.stall_after_iter = stall_after_iter
        os.makedirs(out_dir, exist_ok=True)

    def _path(self, name):
        return os.path.join(self.out_dir, f'{name}_rank{get_rank()}.json')

    def _model(self, runner):
        return runner.model.module if is_model_wrapper(runner.model) else runner.model

    def _dump(self, name, runner):
        with open(self._path(name), 'w') as f:
            json.dump(dict(iter=runner.iter, world_size=get_world_size(),
                           model=fingerprint(self._model(runner).state_dict()),
                           optimizer=fingerprint(runner.optim_wrapper.state_dict())), f)

    def before_train(self, runner):  # after load_or_resume
        self._dump('start', runner)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        with open(self._path('iters'), 'a') as f:
            f.write(f'{runner.iter}\\n')
        if runner.iter + 1 == self.stall_after_iter:
            open(self._path('stalled'), 'w').close()
            time.sleep(600)  # the test kills us here

    def after_train(self, runner):
        self._dump('end', runner)
'''


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    """Tiny shapes data (COCO + ADE layouts) and the probe hook module."""
    from mmvitswin.openmmlab.datasets.shapes import make_shapes
    root = tmp_path_factory.mktemp('tools')
    make_shapes(str(root / 'shapes'), num_train=4, num_val=2, image_size=(64, 64))
    (root / 'pkg').mkdir()
    (root / 'pkg' / 'a1_probe.py').write_text(
        'import hashlib\nimport torch\n\n' + textwrap.dedent(inspect.getsource(fingerprint)) +
        PROBE_HOOK)
    return root


def _env(work):
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([str(work / 'pkg'), ROOT, env.get('PYTHONPATH', '')])
    env['OMP_NUM_THREADS'] = '1'
    env.pop('MMVITSWIN_TRUST_CHECKPOINTS', None)
    return env


def _run(cmd, work, timeout=300, check=True):
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(work), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f'{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n'
                    f'{proc.stderr[-5000:]}')
    return proc


def _probe(out_dir, **kw):
    args = ''.join(f', {k}={v!r}' for k, v in kw.items())
    return f"custom_hooks = [dict(type='ProbeHook', out_dir={str(out_dir)!r}{args})]\n"


def _mask_rcnn_config(work, name, extra=''):
    data = work / 'shapes' / 'coco'
    path = work / f'{name}.py'
    path.write_text(textwrap.dedent(f'''\
        _base_ = {osp.join(ROOT, 'configs', 'mask_rcnn_swin_t_coco.py')!r}
        custom_imports = dict(imports=['mmvitswin', 'a1_probe'], allow_failed_imports=False)
        data_root = {str(data) + '/'!r}
        classes = {CLASSES!r}
        scales = [(64, 96), (80, 120)]
        model = dict(
            backbone=dict(depths=[1, 1, 1, 1], init_cfg=None),
            roi_head=dict(bbox_head=dict(num_classes=4, fc_out_channels=256),
                          mask_head=dict(num_classes=4)))
        train_pipeline = [
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
            dict(type='RandomFlip', prob=0.5),
            dict(type='RandomChoice', transforms=[
                [dict(type='RandomChoiceResize', scales=scales, keep_ratio=True)],
                [dict(type='RandomChoiceResize', scales=[(64, 96)], keep_ratio=True),
                 dict(type='RandomCrop', crop_type='absolute_range', crop_size=(48, 64),
                      allow_negative_crop=True),
                 dict(type='RandomChoiceResize', scales=scales, keep_ratio=True)]]),
            dict(type='PackDetInputs')]
        test_pipeline = [
            dict(type='LoadImageFromFile'),
            dict(type='Resize', scale=(96, 64), keep_ratio=True),
            dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
            dict(type='PackDetInputs',
                 meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))]
        train_dataloader = dict(
            batch_size=2, num_workers=0, persistent_workers=False,
            dataset=dict(data_root=data_root, metainfo=dict(classes=classes),
                         ann_file='annotations/instances_train.json',
                         data_prefix=dict(img='train/'), pipeline=train_pipeline,
                         filter_cfg=dict(filter_empty_gt=True, min_size=8)))
        val_dataloader = dict(
            num_workers=0, persistent_workers=False,
            dataset=dict(data_root=data_root, metainfo=dict(classes=classes),
                         ann_file='annotations/instances_val.json',
                         data_prefix=dict(img='val/'), pipeline=test_pipeline))
        test_dataloader = val_dataloader
        val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
        test_evaluator = val_evaluator
        train_cfg = dict(max_epochs=1, val_interval=100)  # 4 images / batch 2 = 2 iterations
        default_hooks = dict(logger=dict(interval=1))
        ''') + extra)
    return str(path)


def _upernet_config(work, name, extra=''):
    data = work / 'shapes' / 'ade'
    path = work / f'{name}.py'
    path.write_text(textwrap.dedent(f'''\
        _base_ = {osp.join(ROOT, 'configs', 'upernet_swin_t_ade20k.py')!r}
        custom_imports = dict(imports=['mmvitswin', 'a1_probe'], allow_failed_imports=False)
        data_root = {str(data)!r}
        crop_size = (64, 64)
        model = dict(
            data_preprocessor=dict(size=crop_size),
            backbone=dict(depths=[1, 1, 1, 1], init_cfg=None),
            decode_head=dict(channels=64), auxiliary_head=dict(channels=32))
        train_pipeline = [
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', reduce_zero_label=True),
            dict(type='RandomResize', scale=(128, 64), ratio_range=(0.5, 2.0), keep_ratio=True),
            dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
            dict(type='RandomFlip', prob=0.5),
            dict(type='PhotoMetricDistortion'),
            dict(type='PackSegInputs')]
        train_dataloader = dict(
            batch_size=2, num_workers=0, persistent_workers=False,
            dataset=dict(data_root=data_root, pipeline=train_pipeline))
        val_dataloader = dict(num_workers=0, persistent_workers=False,
                              dataset=dict(data_root=data_root))
        test_dataloader = val_dataloader
        train_cfg = dict(max_iters=2, val_interval=100)
        default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=2))
        ''') + extra)
    return str(path)


def _read(path):
    with open(path) as f:
        return json.load(f)


def test_train_and_test_mask_rcnn_swin_t(work):
    wd = work / 'wd_mask_rcnn'
    cfg = _mask_rcnn_config(work, 'mask_rcnn_tiny', _probe(wd / 'probe'))
    proc = _run([PY, 'tools/train.py', cfg, '--work-dir', str(wd)], work)
    assert 'Epoch(train) [1][2/2]' in proc.stdout + proc.stderr
    iters = open(wd / 'probe' / 'iters_rank0.json').read().split()
    assert iters == ['0', '1']
    start, end = _read(wd / 'probe' / 'start_rank0.json'), _read(wd / 'probe' / 'end_rank0.json')
    assert end['iter'] == 2 and start['model'] != end['model']  # it trained
    from mmvitswin.openmmlab.engine.safe_load import safe_torch_load
    ckpt = safe_torch_load(str(wd / 'epoch_1.pth'), map_location='cpu')  # weights-only
    assert ckpt['meta']['iter'] == 2 and ckpt['meta']['dataset_meta']['classes'] == CLASSES
    assert fingerprint(ckpt['state_dict']) == end['model']
    # ... and tools/test.py evaluates it with CocoMetric
    proc = _run([PY, 'tools/test.py', cfg, str(wd / 'epoch_1.pth'), '--work-dir',
                 str(work / 'wd_mask_rcnn_test')], work)
    assert 'coco/bbox_mAP' in proc.stdout and 'coco/segm_mAP' in proc.stdout


def test_upernet_killed_then_resumed_restores_exact_state(work):
    """UPerNet Swin-T trains with tools/train.py, is SIGKILLed after its first checkpoint
    (iteration 2 of 4) and resumed with --resume: it restarts from exactly the saved model and
    optimizer state at iteration 2 and finishes iterations 3 and 4."""
    from mmvitswin.openmmlab.engine.safe_load import allowed_names, safe_torch_load
    wd = work / 'wd_resume'
    probe1, probe2 = wd / 'probe_killed', wd / 'probe_resumed'
    extra = "train_cfg['max_iters'] = 4\n"
    killed_cfg = _upernet_config(work, 'resume_a', extra + _probe(probe1, stall_after_iter=2))
    proc = subprocess.Popen([PY, 'tools/train.py', killed_cfg, '--work-dir', str(wd)], cwd=ROOT,
                            env=_env(work), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not (probe1 / 'stalled_rank0.json').exists():
            assert proc.poll() is None, f'training exited early ({proc.returncode})'
            assert time.time() < deadline, 'training did not reach its first checkpoint'
            time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (wd / 'iter_2.pth').exists() and not (wd / 'iter_4.pth').exists()
    ckpt = safe_torch_load(str(wd / 'iter_2.pth'), map_location='cpu')
    # what the allow-list is for: torch.load(weights_only=True) needs exactly these extras
    from mmvitswin.core.compat import HAS_SAFE_GLOBAL_ALIASES
    if HAS_SAFE_GLOBAL_ALIASES:  # torch >= 2.6; older torch loads with full pickle
        from test_safe_load import globals_in_checkpoint
        unsafe = globals_in_checkpoint(str(wd / 'iter_2.pth'))
        assert 'mmengine.logging.history_buffer.HistoryBuffer' in unsafe
        assert unsafe <= allowed_names()

    resumed_cfg = _upernet_config(work, 'resume_b', extra + _probe(probe2))
    proc = _run([PY, 'tools/train.py', resumed_cfg, '--work-dir', str(wd), '--resume'], work)
    out = proc.stdout + proc.stderr
    assert 'resumed epoch: 0, iter: 2' in out and 'Iter(train) [4/4]' in out
    assert 'SyncBN -> BN' in out  # the config's SyncBN heads run as BN in one process
    start = _read(probe2 / 'start_rank0.json')
    assert start['iter'] == 2
    assert start['model'] == fingerprint(ckpt['state_dict'])
    assert start['optimizer'] == fingerprint(ckpt['optimizer'])
    assert len(start['optimizer']['state']) > 0  # AdamW moments really came back
    assert open(probe2 / 'iters_rank0.json').read().split() == ['2', '3']
    final = safe_torch_load(str(wd / 'iter_4.pth'), map_location='cpu')
    assert final['meta']['iter'] == 4
    assert fingerprint(final['state_dict']) == _read(probe2 / 'end_rank0.json')['model']


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_dist_train_two_gloo_processes_end_identical(work):
    import glob
    demos = sorted(glob.glob(osp.join(ROOT, 'configs', 'demo', 'mask_rcnn_swin*.py')))
    assert demos, 'no Mask R-CNN Swin demo config under configs/demo'
    wd = work / 'wd_dist'
    data = work / 'shapes' / 'coco'
    cfg = work / 'dist_demo.py'
    cfg.write_text(textwrap.dedent(f'''\
        _base_ = {demos[0]!r}
        custom_imports = dict(imports=['mmvitswin', 'a1_probe'], allow_failed_imports=False)
        data_root = {str(data) + '/'!r}
        train_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
                                dataset=dict(data_root=data_root))
        val_dataloader = dict(num_workers=0, persistent_workers=False,
                              dataset=dict(data_root=data_root))
        test_dataloader = val_dataloader
        val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
        test_evaluator = val_evaluator
        train_cfg = dict(max_iters=2, val_interval=100)
        default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=100))
        ''') + _probe(wd / 'probe'))
    env_port = {'PORT': str(_free_port()), 'PYTHON': PY}
    proc = subprocess.run(['bash', 'tools/dist_train.sh', str(cfg), '2', '--work-dir', str(wd)],
                          cwd=ROOT, env={**_env(work), **env_port}, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f'dist_train.sh exited {proc.returncode}\n{proc.stdout[-3000:]}\n'
                    f'{proc.stderr[-5000:]}')
    ends = [_read(wd / 'probe' / f'end_rank{r}.json') for r in (0, 1)]
    starts = [_read(wd / 'probe' / f'start_rank{r}.json') for r in (0, 1)]
    assert [e['world_size'] for e in ends] == [2, 2]
    assert [e['iter'] for e in ends] == [2, 2]
    assert ends[0]['model'] == ends[1]['model']  # gradients were all-reduced
    assert ends[0]['model'] != starts[0]['model']  # and they did train
    assert 'gloo' in proc.stdout + proc.stderr


def _tool(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f'a1_tool_{name}',
                                                  osp.join(ROOT, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('config,where', [
    ('mask_rcnn_swin_t_coco.py', 'data/coco/'),
    ('upernet_swin_t_ade20k.py', 'data/ade/ADEChallengeData2016'),
])
def test_missing_dataset_stops_at_once(config, where, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no data/ here
    cfg = osp.join(ROOT, 'configs', config)
    assert _tool('train').main([cfg, '--work-dir', str(tmp_path / 'wd')]) == 2
    err = capsys.readouterr().err
    assert f'train_dataloader ({"CocoDataset" if "coco" in config else "ADE20KDataset"}): ' \
           f'data root {where}' in err
    assert 'docs/datasets.md' in err and 'make demo' in err and 'Traceback' not in err
    assert not (tmp_path / 'wd').exists()  # stopped before the Runner was built
    ckpt = tmp_path / 'w.pth'
    torch.save({'state_dict': {}}, ckpt)
    assert _tool('test').main([cfg, str(ckpt)]) == 2
    assert f'test_dataloader' in capsys.readouterr().err


def test_missing_annotation_file_is_named(work, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(work / 'pkg'))
    cfg = _mask_rcnn_config(work, 'bad_ann',
                            "train_dataloader['dataset']['ann_file'] = 'annotations/nope.json'\n")
    assert _tool('train').main([cfg, '--work-dir', str(tmp_path / 'wd')]) == 2
    err = capsys.readouterr().err
    assert f'annotation file {work / "shapes" / "coco" / "annotations" / "nope.json"}' in err


def test_tool_argument_errors(work, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(work / 'pkg'))
    train = _tool('train')
    assert train.main([str(tmp_path / 'nope.py')]) == 2
    assert 'config file not found' in capsys.readouterr().err
    cfg = _upernet_config(work, 'args_check')
    assert train.main([cfg, '--resume', str(tmp_path / 'nope.pth')]) == 2
    assert 'file not found' in capsys.readouterr().err
    if not torch.cuda.is_available():  # --amp trains in bf16 on CPU (test_amp_runner.py)
        assert train.main([cfg, '--amp', '--amp-dtype', 'fp16']) == 2
        assert 'fp16 needs CUDA' in capsys.readouterr().err


def test_prepare_config_cpu_distributed_and_sync_bn():
    """What the tools change for a CPU torchrun launch (MMEngine alone would ask for NCCL)."""
    from mmengine.config import Config
    from mmvitswin.openmmlab.engine.launch import prepare_config
    path = osp.join(ROOT, 'configs', 'upernet_swin_t_ade20k.py')
    cfg = Config.fromfile(path)
    notes = prepare_config(cfg, path, launcher='pytorch', resume='auto', cuda=False)
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert cfg.model_wrapper_cfg.device_ids is None
    assert cfg.model.decode_head.norm_cfg.type == 'BN'
    assert cfg.model.auxiliary_head.norm_cfg.type == 'BN'
    assert cfg.resume is True and cfg.load_from is None and cfg.launcher == 'pytorch'
    assert cfg.work_dir == './work_dirs/upernet_swin_t_ade20k'
    assert any('gloo' in n for n in notes)
    cfg = Config.fromfile(path)
    prepare_config(cfg, path, launcher='pytorch', cuda=True)  # real multi-GPU run: untouched
    assert cfg.model.decode_head.norm_cfg.type == 'SyncBN'
    # a config naming no runner (mmdet's own, say) runs on ours; a config's choice is kept
    plain = Config(dict(model=dict(type='mmvitswin.SwinTransformer')))
    notes = prepare_config(plain, 'plain.py', cuda=False)
    assert plain.runner_type == 'mmvitswin.SafeCheckpointRunner'
    assert any('SafeCheckpointRunner' in n for n in notes)
    own = Config(dict(model=dict(type='mmvitswin.SwinTransformer'), runner_type='Runner'))
    prepare_config(own, 'own.py', cuda=False)
    assert own.runner_type == 'Runner'
    assert cfg.env_cfg.dist_cfg.backend == 'nccl' and 'model_wrapper_cfg' not in cfg

"""FSDP2Strategy (mmvitswin/openmmlab/engine/fsdp.py) on MMEngine's FlexibleRunner: two gloo
processes through tools/dist_train.sh, against one process through tools/train.py.

The model is the FSDP2 demo config's (a narrow DINOv3-7B-structured ViT with the interaction
adapter, Mask R-CNN), every run starting from the same weights file (``load_from``). A sampler
gives every process the same images in the same order (no random flip), and a probe hook seeds
torch per iteration (the RPN/RoI samplers draw the same boxes in every process and after a
resume): each process then computes the single-process gradient, FSDP2 averages identical
gradients, and the losses must equal the single-process run's. The probe, imported by the
training processes, also records the losses and compares each process's shards of every
parameter with the weights file's tensors.
"""
import json
import math
import os
import os.path as osp
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from mmvitswin.openmmlab.engine.fsdp import HAS_FSDP2

pytestmark = [
    pytest.mark.slow(reason='trains through tools/dist_train.sh (two gloo processes, four '
                     'launches)'),
    pytest.mark.timeout(1200),
    pytest.mark.skipif(not HAS_FSDP2, reason='FSDP2 (torch.distributed.fsdp.fully_shard) '
                       'needs torch >= 2.6'),
]

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs', 'demo', 'mask_rcnn_dinov3_adapter_fsdp2_shapes.py')
ITERS = 4

PROBE = '''
import json, os, signal
import torch
from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.registry import DATA_SAMPLERS, HOOKS
from torch.utils.data import Sampler


@DATA_SAMPLERS.register_module(force=True)
class SameOnEveryRank(Sampler):
    """Every item in order, on every process."""

    def __init__(self, dataset, seed=None):
        self.dataset, self.size = dataset, len(dataset)

    def __iter__(self):
        return iter(range(self.size))

    def __len__(self):
        return self.size

    def set_epoch(self, epoch):
        pass


@HOOKS.register_module(force=True)
class FSDPProbe(Hook):
    priority = 'LOWEST'

    def __init__(self, out_dir, init_file=None, kill_at_save=-1, only=''):
        self.out_dir, self.init_file, self.kill_at_save = out_dir, init_file, kill_at_save
        self.only = only
        os.makedirs(out_dir, exist_ok=True)

    def _write(self, name, record):
        with open(os.path.join(self.out_dir, f'{name}_rank{get_rank()}.jsonl'), 'a') as f:
            f.write(json.dumps(record) + '\\n')

    def before_run(self, runner):
        if self.kill_at_save < 0:
            return
        from mmvitswin.openmmlab.engine import fsdp
        publish = fsdp._publish

        def killed(tmp, path):  # the shards are written, the directory not yet renamed
            if path.endswith(f'iter_{self.kill_at_save}.pth'):
                os.kill(os.getpid(), signal.SIGKILL)
            publish(tmp, path)
        fsdp._publish = killed

    def before_train(self, runner):  # after load_or_resume
        if self.init_file is None or runner.iter > 0:
            return
        want = torch.load(self.init_file, map_location='cpu', weights_only=True)['state_dict']
        errors, n = {}, get_world_size()
        for name, p in runner.model.named_parameters():
            if not name.startswith(self.only):
                continue
            local = p.to_local() if hasattr(p, 'to_local') else p
            pieces = torch.chunk(want[name], n, dim=0)  # FSDP2's dim-0 shards (fewer if small)
            part = pieces[get_rank()] if get_rank() < len(pieces) else want[name][:0]
            errors[name] = float((local.detach() - part).abs().sum()) if (
                local.shape == part.shape) else f'shape {list(local.shape)} vs {list(part.shape)}'
        self._write('weights', dict(world_size=n, errors=errors))

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        torch.manual_seed(1000 + runner.iter)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        losses = {k: float(v) for k, v in outputs.items()}
        self._write('loss', dict(iter=runner.iter + 1, loss=losses))
'''


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    """Shapes data, the probe module and the whole detector's initial weights (a runner
    checkpoint file, as ``load_from`` reads)."""
    import mmvitswin  # noqa: F401
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmvitswin.openmmlab.datasets.shapes import make_shapes
    root = tmp_path_factory.mktemp('fsdp2')
    make_shapes(str(root / 'shapes'), num_train=4, num_val=2, image_size=(64, 64))
    (root / 'pkg').mkdir()
    (root / 'pkg' / 'fsdp_probe.py').write_text(PROBE)
    torch.manual_seed(3)
    with DefaultScope.overwrite_default_scope('mmdet'):
        from mmdet.registry import MODELS
        model = MODELS.build(Config.fromfile(DEMO).model)
    model.init_weights()
    torch.save(dict(state_dict=model.state_dict(), meta={}), root / 'init.pth')
    return root


def _config(work, name, distributed=True, **probe):
    """A config of the demo on the test data; ``probe``: the FSDPProbe hook's arguments (its
    out_dir: work/probe_<name>)."""
    data = work / 'shapes' / 'coco'
    path = work / f'{name}.py'
    probe = dict(out_dir=str(work / f'probe_{name}'), **probe)
    strategy = ("strategy = dict(mixed_precision=None)\n" if distributed else
                "runner_type = 'mmvitswin.SafeCheckpointRunner'\nstrategy = None\n")
    path.write_text(textwrap.dedent(f'''\
        _base_ = {DEMO!r}
        custom_imports = dict(imports=['mmvitswin', 'fsdp_probe'], allow_failed_imports=False)
        data_root = {str(data) + '/'!r}
        train_dataloader = dict(
            batch_size=1, num_workers=0, persistent_workers=False,
            sampler=dict(_delete_=True, type='SameOnEveryRank'),
            dataset=dict(data_root=data_root, pipeline=[
                dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
                dict(type='Resize', scale=(64, 64), keep_ratio=True),
                dict(type='PackDetInputs')]))
        val_dataloader = dict(num_workers=0, persistent_workers=False,
                              dataset=dict(data_root=data_root))
        test_dataloader = val_dataloader
        val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
        test_evaluator = val_evaluator
        train_cfg = dict(max_iters={ITERS}, val_interval=100)
        param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False)]
        default_hooks = dict(logger=dict(interval=1),
                             checkpoint=dict(interval=2, max_keep_ckpts=3))
        load_from = {str(work / 'init.pth')!r}
        # the gradient norm is computed (over the shards under FSDP2) but never clips: its
        # sum runs in another order there, and AdamW turns that round-off into 1e-4 loss
        # differences within three steps
        optim_wrapper = dict(clip_grad=dict(max_norm=1e6, norm_type=2))
        custom_hooks = [dict(type='FSDPProbe', **{probe!r})]
        ''') + strategy)
    return path


def _train(work, cfg, wd, nproc=2, check=True):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHON=sys.executable, PORT=str(_free_port()))
    env['PYTHONPATH'] = os.pathsep.join([str(work / 'pkg'), ROOT, env.get('PYTHONPATH', '')])
    if nproc > 1:
        cmd = ['bash', 'tools/dist_train.sh', str(cfg), str(nproc)]
    else:
        cmd = [sys.executable, 'tools/train.py', str(cfg)]
    proc = subprocess.run(cmd + ['--work-dir', str(wd)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        pytest.fail(f'{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n'
                    f'{proc.stderr[-6000:]}')
    return proc


def _losses(probe, rank=0):
    with open(probe / f'loss_rank{rank}.jsonl') as f:
        return {r['iter']: r['loss'] for r in map(json.loads, f)}


def _assert_same_losses(got, want, iters):
    for it in iters:
        for key, value in want[it].items():
            if key == 'loss' or key.startswith('loss_'):
                rel = abs(got[it][key] - value) / max(abs(value), 1e-12)
                assert rel <= 1e-4, (it, key, got[it][key], value)


def test_fsdp2_equals_one_process_resumes_exactly_and_survives_a_killed_save(work):
    single = _train(work, _config(work, 'single', distributed=False), work / 'wd_single',
                    nproc=1)
    assert 'FSDP2' not in single.stdout + single.stderr
    run = _train(work, _config(work, 'fsdp', init_file=str(work / 'init.pth')),
                 work / 'wd_fsdp')
    assert 'FSDP2:' in run.stdout + run.stderr

    # every process holds its shards of the weights file, exactly (trunk and the rest)
    for rank in (0, 1):
        with open(work / 'probe_fsdp' / f'weights_rank{rank}.jsonl') as f:
            record = json.loads(f.readline())
        assert record['world_size'] == 2
        assert sum(k.startswith('backbone.blocks.') for k in record['errors']) > 10
        bad = {k: v for k, v in record['errors'].items() if v != 0.0}
        assert not bad, bad

    # the same losses as one process on the same data, on both processes
    want = _losses(work / 'probe_single')
    assert sorted(want) == list(range(1, ITERS + 1))
    for rank in (0, 1):
        _assert_same_losses(_losses(work / 'probe_fsdp', rank), want, want)
    assert want[ITERS]['loss'] != want[1]['loss']  # it trained

    # sharded checkpoints: directories with the metadata and the runner state
    wd = work / 'wd_fsdp'
    for it in (2, 4):
        ckpt = wd / f'iter_{it}.pth'
        assert (ckpt / '.metadata').is_file() and (ckpt / 'runner.pth').is_file(), ckpt
        assert len(list(ckpt.glob('*.distcp'))) == 2  # one file per process

    # killed while saving iteration 4 (shards written, not yet renamed): iteration 2 stays
    # the newest complete checkpoint, and --resume continues from it to the same losses
    killed_wd = work / 'wd_killed'
    killed = _train(work, _config(work, 'killed', kill_at_save=4), killed_wd, check=False)
    assert killed.returncode != 0
    assert (killed_wd / 'iter_2.pth' / '.metadata').is_file()
    assert not (killed_wd / 'iter_4.pth').exists()
    assert (killed_wd / 'last_checkpoint').read_text().strip().endswith('iter_2.pth')
    resume_cfg = _config(work, 'resumed')
    with open(resume_cfg, 'a') as f:
        f.write('resume = True\nload_from = None\n')  # (MMEngine resumes from load_from)
    resumed = _train(work, resume_cfg, killed_wd)
    assert 'iter_2.pth' in resumed.stdout + resumed.stderr
    got = _losses(work / 'probe_resumed')
    assert sorted(got) == [3, 4]
    _assert_same_losses(got, want, (3, 4))

    # consolidated: one runner checkpoint file with the full weights of the sharded one
    from mmvitswin.openmmlab.engine.fsdp import consolidate_checkpoint, read_sharded
    out = consolidate_checkpoint(str(wd / 'iter_4.pth'), str(work / 'iter_4_full.pth'))
    full = torch.load(out, map_location='cpu', weights_only=False)
    assert 'optimizer' not in full and full['meta']['iter'] == 4
    sharded = read_sharded(str(wd / 'iter_4.pth'))
    assert sorted(full['state_dict']) == sorted(sharded['state_dict'])
    assert any(k.startswith('backbone.blocks.') for k in full['state_dict'])


def test_meta_init_fills_each_shard_from_a_sharded_safetensors_snapshot(work):
    """FSDP2Strategy(meta_init=True): the blocks are built on the meta device and each process
    fills its shards from the backbone's checkpoint, here two safetensors shards and their
    index; every process then holds exactly the file's pieces, and it trains."""
    from safetensors.torch import save_file
    full = torch.load(work / 'init.pth', map_location='cpu', weights_only=True)['state_dict']
    trunk = {k[len('backbone.'):]: v.contiguous() for k, v in full.items()
             if k.startswith('backbone.') and not k.startswith('backbone.adapter.')}
    snap = work / 'trunk_snapshot'
    snap.mkdir()
    keys = sorted(trunk)
    shards = {'model-00001-of-00002.safetensors': keys[::2],
              'model-00002-of-00002.safetensors': keys[1::2]}
    for name, part in shards.items():
        save_file({k: trunk[k] for k in part}, str(snap / name))
    (snap / 'model.safetensors.index.json').write_text(json.dumps(dict(
        metadata={}, weight_map={k: n for n, part in shards.items() for k in part})))
    cfg = _config(work, 'meta_init', init_file=str(work / 'init.pth'), only='backbone.blocks.')
    with open(cfg, 'a') as f:
        f.write(textwrap.dedent(f'''\
            load_from = None
            strategy = dict(meta_init=True)
            model = dict(backbone=dict(init_cfg=dict(
                _delete_=True, type='Pretrained',
                checkpoint={str(snap / 'model.safetensors.index.json')!r})))
            '''))
    run = _train(work, cfg, work / 'wd_meta_init')
    assert "shards filled from" in run.stdout + run.stderr
    for rank in (0, 1):
        with open(work / 'probe_meta_init' / f'weights_rank{rank}.jsonl') as f:
            record = json.loads(f.readline())
        assert len(record['errors']) > 10
        bad = {k: v for k, v in record['errors'].items() if v != 0.0}
        assert not bad, bad
    losses = _losses(work / 'probe_meta_init')
    assert sorted(losses) == list(range(1, ITERS + 1))
    assert all(math.isfinite(r['loss']) for r in losses.values())

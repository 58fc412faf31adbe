"""tools/benchmark.py and mmvitswin.benchmark: the instrument works and reports what it claims.

No test here asserts anything about speed: times are only checked to exist and be positive.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from mmvitswin.benchmark import (count_flops, gemm_peak, measure_peak_memory, median,
                                 parse_dtype)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, 'tools', 'benchmark.py')
TINY = dict(depths=[1, 1, 1, 1], embed_dims=32, num_heads=[1, 2, 4, 8])
CPU = torch.device('cpu')


def _load_tool():
    spec = importlib.util.spec_from_file_location('benchmark_tool', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def tool():
    return _load_tool()


# ------------------------------------------------------------------------------ end to end
@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp('bench')
    cmd = [sys.executable, TOOL, '--backbone', 'SwinTransformer', '--backbone-kwargs',
           json.dumps(TINY), '--forward', '64:2', '--train', '64x80:1', '--with-cp',
           '--sweep', '64', '96', '--runs', '1', '--warmup', '0', '--gemm-size', '256',
           '--threads', '1', '--out-dir', str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / 'benchmark.json') as f:
        report = json.load(f)
    return out, report, proc.stdout


def test_json_has_machine_settings_and_every_case(tiny_run):
    _, report, _ = tiny_run
    assert {'machine', 'settings', 'results', 'gemm_peak', 'targets', 'wall_s', 'plot',
            'errors'} <= set(report)
    assert report['errors'] == 0
    machine = report['machine']
    assert machine['torch'] == torch.__version__ and machine['torch_threads'] == 1
    assert machine['cpu_count'] >= 1 and machine['cpu_model']
    names = [r['name'] for r in report['results']]
    assert names == ['forward 64x64 b2', 'train 64x80 b1', 'train 64x80 b1 with_cp',
                     'forward 64x64 b1', 'forward 96x96 b1']
    for r in report['results']:
        assert set(r['variants']) == {'ours', 'ref'}
        for v in r['variants'].values():
            assert len(v['times_s']) == 1 and v['median_s'] == v['times_s'][0] > 0
        assert r['speedup'] == pytest.approx(
            r['variants']['ref']['median_s'] / r['variants']['ours']['median_s'])


def test_reference_has_our_weights_and_outputs(tiny_run):
    _, report, _ = tiny_run
    for r in report['results']:
        assert r['weights_identical'] is True, r['name']
        assert r['reference'] == 'mmdet.models.backbones.swin.SwinTransformer'
        if r['kind'] == 'forward':
            assert r['first_run_max_abs_diff'] < 1e-4 and r['outputs_match'] is True, r['name']


def test_memory_flops_and_gemm_peak_are_reported(tiny_run):
    _, report, _ = tiny_run
    gemm = report['gemm_peak']['fp32']
    assert gemm['n'] == 256 and gemm['gflops'] > 0
    by_name = {r['name']: r for r in report['results']}
    fwd, train, cp = (by_name['forward 64x64 b2'], by_name['train 64x80 b1'],
                      by_name['train 64x80 b1 with_cp'])
    for r in (fwd, train, cp):
        for v in r['variants'].values():
            assert v['memory_method'] == 'rss-hwm' and v['peak_bytes'] >= 0
    # a train step holds gradients (and here, with no warm-up, creates AdamW state)
    assert train['variants']['ours']['peak_bytes'] > fwd['variants']['ours']['peak_bytes']
    assert cp['cp_mem_ratio'] == pytest.approx(
        cp['variants']['ours']['peak_bytes'] / train['variants']['ours']['peak_bytes'])
    # forward FLOPs scale with the batch; fwd+bwd is about three forwards
    assert fwd['flops'] > 0 and train['flops'] > fwd['flops'] / 2
    assert fwd['variants']['ours']['pct_gemm_peak'] == pytest.approx(
        100 * fwd['flops'] / fwd['variants']['ours']['median_s'] / 1e9 / gemm['gflops'])
    # the sweep skips the memory run
    assert 'peak_bytes' not in by_name['forward 96x96 b1']['variants']['ours']


def test_markdown_and_plot_are_written(tiny_run):
    out, report, stdout = tiny_run
    text = (out / 'benchmark.md').read_text()
    assert text.strip() in stdout  # the same tables are printed
    assert '## Backbone' in text and '## Forward time against input size' in text
    assert '| forward 64x64 b2 |' in text and '| train 64x80 b1 with_cp |' in text
    png = out / 'forward_vs_size.png'
    assert report['plot'] == 'forward_vs_size.png'
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and png.stat().st_size > 5000


# --------------------------------------------------------------------------- whole model
def test_whole_model_pair_has_identical_weights_and_trains(tool, tmp_path):
    # mmseg's own UPerNet Swin-T config with slim heads (a config file path also works)
    upernet = tool.parse_whole('upernet=64:2')[1]
    path = tmp_path / 'slim_upernet.py'
    path.write_text(f"_base_ = [{upernet!r}]\n"
                    "model = dict(decode_head=dict(channels=32), "
                    "auxiliary_head=dict(channels=16))\n")
    label, path, hw, batch_size = tool.parse_whole(f'{path}=64:2')
    assert (label, hw, batch_size) == ('slim_upernet', (64, 64), 2)
    # drop_path_rate=0: the two Swins draw drop-path masks differently from the same RNG
    pair, host, model_cfg = tool.build_whole_pair(
        path, (64, 64), dict(depths=[1, 1, 1, 1], drop_path_rate=0.0), CPU, seed=0)
    from mmseg.models.backbones.swin import SwinTransformer as MMSegSwin
    from mmvitswin.models.backbones.swin import SwinTransformer
    assert host == 'mmseg' and pair.info['weights_identical'] is True
    assert type(pair.models['ours'].backbone) is SwinTransformer
    assert type(pair.models['ref'].backbone) is MMSegSwin
    assert model_cfg['decode_head']['norm_cfg']['type'] == 'BN'  # SyncBN replaced
    batch = tool.synthetic_seg_batch(2, (64, 64), 150, seed=0)
    steps = {}
    for name, model in pair.models.items():
        model.train()
        steps[name] = tool.whole_train_step(model, batch, CPU, 'fp32')
    measured = tool.run_interleaved(steps, CPU, warmup=0, runs=1, memory=False, seed=0)
    for name in ('ours', 'ref'):
        assert len(measured[name]['times_s']) == 1 and measured[name]['median_s'] > 0
    # same weights, same batch, same dropout draws: the first losses agree
    assert measured['first_run_max_abs_diff'] < 1e-5


def test_detection_batch_is_consistent(tool):
    batch = tool.synthetic_det_batch(2, (48, 64), num_classes=5, seed=1)
    assert [tuple(x.shape) for x in batch['inputs']] == [(3, 48, 64)] * 2
    for sample in batch['data_samples']:
        gt = sample.gt_instances
        boxes = gt.bboxes
        assert boxes.shape == (3, 4) and (boxes[:, 2:] > boxes[:, :2]).all()
        assert (boxes[:, 2] <= 64).all() and (boxes[:, 3] <= 48).all()
        assert gt.masks.masks.shape == (3, 48, 64)
        # each mask fills exactly its box
        areas = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).long()
        assert torch.equal(torch.from_numpy(gt.masks.masks.sum((1, 2))).long(), areas)
        assert ((gt.labels >= 0) & (gt.labels < 5)).all()


# --------------------------------------------------------------------------- primitives
def test_peak_memory_sees_an_allocation_of_known_size():
    size = 64 * 2**20

    def allocate():
        t = torch.ones(size // 4)  # touched, so resident
        return float(t[-1])
    mem = measure_peak_memory(allocate, CPU)
    assert mem.method == 'rss-hwm'
    assert 0.9 * size <= mem.peak_bytes <= 1.5 * size
    idle = measure_peak_memory(lambda: None, CPU)
    assert idle.peak_bytes < 8 * 2**20
    # freed in between: a second measurement sees the allocation again (no lifetime max)
    assert measure_peak_memory(allocate, CPU).peak_bytes >= 0.9 * size


def test_count_flops_counts_a_linear_exactly():
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(5, 16)
    with torch.no_grad():
        assert count_flops(lambda: layer(x)) == 2 * 5 * 16 * 8


def test_gemm_peak_and_helpers_validate():
    result = gemm_peak(CPU, n=64, runs=2, warmup=0)
    assert len(result['times_s']) == 2 and result['flops'] == 2 * 64**3
    with pytest.raises(ValueError, match='runs'):
        gemm_peak(CPU, n=64, runs=0)
    with pytest.raises(ValueError, match='dtype'):
        parse_dtype('fp8')
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([]) is None


def test_max_abs_diff(tool):
    a = (torch.zeros(2, 3), torch.ones(4))
    b = (torch.zeros(2, 3), torch.ones(4) + 0.5)
    assert tool.max_abs_diff(a, b) == 0.5
    assert tool.max_abs_diff(a, (torch.zeros(2, 3), )) == float('inf')
    assert tool.max_abs_diff(torch.zeros(2), torch.zeros(3)) == float('inf')


def test_argument_parsing_and_errors(tool):
    assert tool.parse_size('224') == (224, 224)
    assert tool.parse_size('800x1344') == (800, 1344)
    assert tool.parse_case('512:2') == ((512, 512), 2)
    assert tool.parse_case('64x80') == ((64, 80), 1)
    for bad in ('0', 'axb', '1x2x3', '-4'):
        with pytest.raises(ValueError, match='size'):
            tool.parse_size(bad)
    with pytest.raises(ValueError, match='batch'):
        tool.parse_case('64:0')
    with pytest.raises(ValueError, match='whole model'):
        tool.parse_whole('no_such_model=64:1')
    with pytest.raises(ValueError, match='--runs'):
        tool.resolve_args(['--runs', '0'])
    with pytest.raises(ValueError, match='--threads'):
        tool.resolve_args(['--threads', 'many'])
    assert tool.resolve_args(['--threads', 'auto']).threads == len(os.sched_getaffinity(0))
    args = tool.resolve_args(['--preset', 'standard', '--runs', '5'])
    assert args.runs == 5 and args.forward == ['224:8', '800x1344:1'] and args.whole_runs == 2
    cfg = tool.resolve_backbone_cfg('{"type": "SwinTransformer", "depths": [1, 1, 1, 1]}',
                                    dict(embed_dims=32))
    assert cfg == dict(type='SwinTransformer', depths=[1, 1, 1, 1], embed_dims=32,
                       init_cfg=None)
    with pytest.raises(ValueError, match='does not exist'):
        tool.resolve_backbone_cfg('missing_config.py', {})

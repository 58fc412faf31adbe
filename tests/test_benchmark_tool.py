"""tools/benchmark.py: the instrument runs every kind of case and reports what it claims.

Nothing here asserts anything about speed or memory figures: times are only checked to exist.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, 'tools', 'benchmark.py')
TINY = dict(depths=[1, 1, 1, 1], embed_dims=32, num_heads=[1, 2, 4, 8])
CASES = [
    dict(model='swin_tiny_test', kind='forward', scale=0.15, count=2, batch=1, rows=[
        ['tiny forward fp32', 'ours fp32', 'ref fp32', 'time'],
        ['tiny forward bf16 vs ref fp32', 'ours bf16', 'ref fp32', 'time']]),
    dict(model='swin_tiny_test', kind='train', scale=0.15, count=1, batch=2, rows=[
        ['tiny train bf16 AMP vs ref bf16', 'ours bf16', 'ref bf16', 'time'],
        ['tiny train peak bf16 vs ref fp32', 'ours bf16', 'ref fp32', 'peak'],
        ['tiny train peak with_cp', 'ours fp32 cp', 'ours fp32', 'peak']]),
    dict(model='swin_tiny_test', kind='rss', scale=0.15, count=3, batch=1, rows=[
        ['tiny rss', 'ours fp32', 'ref fp32', 'rss']]),
    dict(model='swin_tiny_test', kind='rss_train', sides=(64, 160), count=2, batch=1, rows=[
        ['tiny rss train', 'ours fp32', 'ref fp32', 'rss']]),
    dict(model='hybrid_vit_t', kind='forward', scale=0.1, count=1, batch=1,
         backbone_kwargs=dict(num_layers=2, cnn_depths=[1, 1, 1]), rows=[
             ['hybrid forward fp32', 'ours fp32', 'ref fp32', 'time']]),
    dict(model='no_such_backbone', kind='forward', scale=0.1, count=1, batch=1, rows=[
        ['broken case', 'ours fp32', None, 'time']]),
]


def _load_tool():
    spec = importlib.util.spec_from_file_location('benchmark_tool', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def tool():
    return _load_tool()


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp('bench')
    cases = out / 'cases.json'
    cases.write_text(json.dumps(CASES))
    proc = subprocess.run([sys.executable, TOOL, '--cases', str(cases), '--threads', '1',
                           '--out-dir', str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    with open(out / 'benchmark.json') as f:
        report = json.load(f)
    return out, report, proc


def test_every_case_kind_reports_its_rows(run):
    _, report, proc = run
    assert proc.returncode == 1 and report['errors'] == 1, proc.stderr[-3000:]  # the broken one
    assert {'machine', 'settings', 'cases', 'wall_s', 'errors'} <= set(report)
    assert report['machine']['threads'] == 1 and report['machine']['torch']
    fwd, train, rss, rss_train, hybrid, broken = report['cases']
    for case in (fwd, train, rss, rss_train, hybrid):
        assert 'error' not in case, case.get('error')
        sizes = [tuple(s) for s in case['sizes']]
        assert len(set(sizes)) == len(sizes) == case['case']['count'] + 1
        assert all(h % 32 == 0 and w % 32 == 0 for h, w in sizes)
    # forward: both passes timed for every variant, call by call on the same sizes
    assert set(fwd['variants']) == {'ours fp32', 'ref fp32', 'ours bf16'}
    for v in fwd['variants'].values():
        assert len(v['first']) == len(v['again']) == 2 and min(v['first'] + v['again']) > 0
    row = fwd['rows'][1]
    assert row['reference'] == 'mmdet' and row['first_speedup'] == pytest.approx(
        sum(fwd['variants']['ref fp32']['first']) / sum(fwd['variants']['ours bf16']['first']))
    # train: memory rows carry both peaks and their ratio
    peak, cp = train['rows'][1], train['rows'][2]
    assert peak['peak_mib'] > 0 and peak['peak_mib_baseline'] > 0
    assert peak['peak_ratio'] == pytest.approx(peak['peak_mib'] / peak['peak_mib_baseline'])
    assert cp['subject'] == 'ours fp32 cp' and cp['peak_ratio'] > 0
    # rss: growth of each model and the difference
    for r in (rss['rows'][0], rss_train['rows'][0]):
        assert r['rss_diff_mib'] == pytest.approx(r['rss_mib'] - r['rss_mib_baseline'])
    # the training memory case draws each side from its range
    assert all(64 <= s <= 160 for size in rss_train['sizes'] for s in size)
    # a backbone without a reference is timed alone
    h = hybrid['rows'][0]
    assert h['reference'] is None and h['first_ms'] > 0 and h['first_speedup'] is None
    assert set(hybrid['variants']) == {'ours fp32'}
    assert broken['error'].startswith('KeyError') and broken['rows'][0]['error']


def test_markdown_tables(run):
    out, report, proc = run
    text = (out / 'benchmark.md').read_text()
    assert text in proc.stdout  # the same tables are printed
    for heading in ('## Time', '## Peak memory', '## Resident memory growth'):
        assert heading in text
    lines = {line.split('|')[1].strip(): line for line in text.splitlines()
             if line.startswith('| ')}
    assert 'tiny forward bf16 vs mmdet fp32' in lines  # 'ref' spelled as the package
    hybrid = [c.strip() for c in lines['hybrid forward fp32'].split('|')[1:-1]]
    assert hybrid[2] == '-' and hybrid[5] == '-'  # no baseline, no ratio
    assert 'error in case no_such_backbone' in text


def test_whole_model_train_iteration_with_amp(tool, tmp_path):
    case = dict(model='maskrcnn', kind='whole', scale=0.12, count=1, batch=1,
                backbone_kwargs=dict(depths=[1, 1, 1, 1]),
                rows=[['mask rcnn --amp vs ref fp32', 'ours bf16', 'ref fp32', 'time']])
    args = tool.parse_args(['--threads', '1'])
    import torch
    record = tool.run_case(case, args, torch.device('cpu'))
    row = record['rows'][0]
    assert row['reference'] == 'mmdet' and row['first_ms'] > 0 and row['again_speedup'] > 0
    assert set(record['variants']) == {'ours bf16', 'ref fp32'}


def test_sizes_follow_the_recipe(tool):
    sizes = tool.draw_sizes(20, 1.0, seed=3)
    assert sizes == tool.draw_sizes(20, 1.0, seed=3) != tool.draw_sizes(20, 1.0, seed=4)
    assert len(set(sizes)) == 20
    for h, w in sizes:
        assert h % 32 == 0 and w % 32 == 0
        assert 480 <= min(h, w) <= 800 and max(h, w) <= 1344
    small = tool.draw_sizes(5, 0.25, seed=0)
    assert all(min(s) <= 224 for s in small)
    with pytest.raises(ValueError, match='distinct'):
        tool.draw_sizes(500, 0.05, seed=0)


def test_presets_cover_the_targets_and_every_backbone(tool):
    import mmvitswin.core.backbones as backbones
    from mmvitswin.openmmlab.registry import MODELS
    registered = {name for name, cls in MODELS.module_dict.items()
                  if cls.__module__.startswith(backbones.__name__)}
    standard = tool.PRESETS['standard']
    used = {tool.BACKBONES[c['model']]['type'] for c in standard if c['model'] in tool.BACKBONES}
    assert registered <= used
    labels = [r[0] for c in standard for r in c['rows']]
    assert len(labels) == len(set(labels)) == 25
    metrics = [r[3] for c in standard for r in c['rows']]
    assert metrics.count('peak') == 4 and metrics.count('time') == 21
    variants = {v for c in standard for r in c['rows'] for v in r[1:3] if v}
    assert {'ours fp32 compiled', 'ours bf16 compiled', 'ours fp32 cp', 'ours bf16 sep nhwc'} \
        <= variants
    assert any(c['kind'] == 'whole' for c in standard)
    for preset in tool.PRESETS.values():
        for case in preset:
            assert case['kind'] in ('forward', 'train', 'whole', 'rss', 'rss_train')
            assert case['model'] in tool.BACKBONES or case['model'] in tool.WHOLE


_PEAK_PROBE = """
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location('tool', sys.argv[1])
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)
block = 6 * 2**20 // 4  # 6 MiB of fp32

def one_at_a_time():
    for _ in range(12):
        torch.ones(block).sum()

def held(n):
    def fn():
        blocks = [torch.ones(block) for _ in range(n)]
        return sum(b[0] for b in blocks)
    return fn

cpu = torch.device('cpu')
print(json.dumps([tool.peak_bytes(f, cpu) for f in (one_at_a_time, held(4), held(10))]))
"""


@pytest.mark.skipif(not os.path.exists('/proc/self/clear_refs'), reason='needs Linux procfs')
def test_cpu_peak_counts_memory_held_at_once(tool):
    """In a process with the tool's heap settings (what peaks_in_child starts), blocks freed
    during the call do not count and blocks held together count once each."""
    proc = subprocess.run([sys.executable, '-c', _PEAK_PROBE, TOOL], capture_output=True,
                          text=True, env=dict(os.environ, **tool.EXACT_HEAP), timeout=120)
    assert proc.returncode == 0, proc.stderr
    churn, four, ten = json.loads(proc.stdout.strip().splitlines()[-1])
    mib = 2**20
    assert churn < 16 * mib
    assert abs(four - 24 * mib) < 6 * mib and abs(ten - 60 * mib) < 6 * mib


def test_compile_blocks_wraps_each_repeated_block(tool):
    """Regional compilation: the blocks of every stage, not the stages or the whole model."""
    from mmdet.models.backbones import SwinTransformer as MMDetSwin

    import mmvitswin  # noqa: F401
    from mmvitswin.openmmlab.registry import MODELS
    from torch._dynamo import config as dynamo_config
    kwargs = dict(embed_dims=32, depths=[2, 2, 4, 2], num_heads=[1, 2, 4, 8])
    limits = {a: getattr(dynamo_config, a) for a in ('recompile_limit', 'cache_size_limit')
              if hasattr(dynamo_config, a)}
    try:
        for model in (MODELS.build(dict(type='SwinTransformer', **kwargs)), MMDetSwin(**kwargs)):
            stage_types = {type(s) for s in model.stages}
            assert tool.compile_blocks(model) == 10
            assert {type(s) for s in model.stages} == stage_types  # stages stay eager
            for stage in model.stages:
                for block in stage.blocks:
                    assert isinstance(block, torch._dynamo.eval_frame.OptimizedModule)
                    assert type(block._orig_mod).__name__ == 'SwinBlock'
        assert all(getattr(dynamo_config, a) >= 512 for a in limits)
    finally:  # the tool raises dynamo's recompile limit for its process; not for the suite's
        for attr, value in limits.items():
            setattr(dynamo_config, attr, value)


def test_separable_roi_layers_swaps_every_avg_roi_align(tool):
    """The ' sep' variant: each mmcv RoIAlign of a Mask R-CNN becomes a SeparableRoIAlign
    with the same settings, and the detector's RoI features stay mmcv's."""
    from mmcv.ops import RoIAlign
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    import mmvitswin  # noqa: F401
    from mmdet.registry import MODELS
    from mmvitswin.core.ops import SeparableRoIAlign
    cfg = Config.fromfile(os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_swin_nano_shapes.py'))
    for key in ('bbox_roi_extractor', 'mask_roi_extractor'):  # the stock mmdet heads
        cfg.model.roi_head[key].update(type='SingleRoIExtractor', roi_layer=dict(
            cfg.model.roi_head[key].roi_layer, type='RoIAlign'))
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    extractor = model.roi_head.bbox_roi_extractor
    feats = [torch.randn(1, 64, 64 // s, 64 // s) for s in (4, 8, 16, 32)]
    rois = torch.tensor([[0, 2.0, 3.0, 40.0, 30.0], [0, 10.0, 0.0, 63.0, 60.0],
                         [0, 0.0, 0.0, 9.0, 12.0]])
    before = extractor(feats, rois)
    settings = [(tuple(m.output_size), m.spatial_scale, m.sampling_ratio, m.aligned)
                for m in model.modules() if isinstance(m, RoIAlign)]
    assert tool.separable_roi_layers(model) == len(settings) == 8
    assert not any(isinstance(m, RoIAlign) for m in model.modules())
    assert [(m.output_size, m.spatial_scale, m.sampling_ratio, m.aligned) for m in
            model.modules() if isinstance(m, SeparableRoIAlign)] == settings
    torch.testing.assert_close(extractor(feats, rois), before, atol=2e-5, rtol=1e-4)


def test_channels_last_mask_heads_keeps_the_mask_logits(tool):
    """The ' nhwc' variant: the stock FCNMaskHead of a Mask R-CNN becomes a
    ChannelsLastFCNMaskHead with the same parameters and the same mask logits."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    import mmvitswin  # noqa: F401
    from mmdet.models.roi_heads.mask_heads import FCNMaskHead
    from mmdet.registry import MODELS
    from mmvitswin.openmmlab.models import ChannelsLastFCNMaskHead
    cfg = Config.fromfile(os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_swin_nano_shapes.py'))
    cfg.model.roi_head.mask_head.type = 'FCNMaskHead'
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    head = model.roi_head.mask_head
    assert type(head) is FCNMaskHead
    x = torch.randn(3, 64, 14, 14)
    before, params = head(x), dict(head.named_parameters())
    assert tool.channels_last_mask_heads(model) == 1
    assert type(model.roi_head.mask_head) is ChannelsLastFCNMaskHead
    assert dict(head.named_parameters()) == params
    after = head(x)
    assert after.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4)
    assert tool.channels_last_mask_heads(model) == 0  # already converted


def test_only_and_skip_select_rows_by_label(tool):
    case = dict(model='swin_tiny_test', kind='forward', scale=0.1, count=1, rows=[
        ['tiny compiled', 'ours fp32 compiled', 'ref fp32', 'time']])
    cpu = torch.device('cpu')
    for argv in (['--skip', 'compiled'], ['--only', 'eager'], ['--only', 'tiny', '--skip', 'ny c']):
        assert tool.run_case(case, tool.parse_args(argv), cpu) == dict(case=case, rows=[])


def test_backbone_option_replaces_swin_t(tool):
    args = tool.parse_args(['--backbone', 'ViTAdapter', '--backbone-kwargs',
                            json.dumps(dict(arch='tiny', adapter='simple'))])
    cases = tool.load_cases(args)
    assert tool.BACKBONES['custom'] == dict(type='ViTAdapter', arch='tiny', adapter='simple')
    models = [c['model'] for c in cases]
    assert 'swin_t' not in models and 'custom' in models and 'maskrcnn' in models
    with pytest.raises(SystemExit):
        tool.parse_args(['--count', '0'])

"""tools/benchmark.py: the instrument runs every kind of case and reports what it claims.

Nothing here asserts anything about speed or memory figures: times are only checked to exist.
"""
import importlib.util
import json
import os
import re
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


def timm_available() -> bool:
    """Whether the tool can import timm (itself, or with its torchvision stub)."""
    return _load_tool().import_timm()[0] is not None


def hf_available() -> bool:
    """Whether HF ``transformers`` is installed (the tests extra has it for Python >= 3.10
    only: the oldest tested stack runs the tool without the HF peer)."""
    return importlib.util.find_spec('transformers') is not None


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
    # forward: both passes timed for every variant, call by call on the same sizes; the Swin
    # rows against the reference bring timm's and HF's Swin in the baseline's precision
    peers = ({'hf fp32'} if hf_available() else set()) | \
        ({'timm fp32'} if timm_available() else set())
    assert set(fwd['variants']) == {'ours fp32', 'ref fp32', 'ours bf16'} | peers
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
    for heading in ('## Time', '## Peak memory', '## Resident memory growth', '## Peers',
                    '## GEMM roofline'):
        assert heading in text
    # the timm column says how timm was imported, or why it is not there
    assert re.search(r'^- timm (1\.\S+ imported with a torchvision stub|1\.\S+:|not benchmarked)',
                     text, re.MULTILINE), text
    sections = {s.split('\n', 1)[0]: s for s in text.split('\n## ')}

    def cells(section: str) -> dict:
        return {line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
                for line in sections[section].splitlines() if line.startswith('| ')}
    time = cells('Time (new sizes, then the same sizes again)')
    assert 'tiny forward bf16 vs mmdet fp32' in time  # 'ref' spelled as the package
    hybrid = time['hybrid forward fp32']
    assert hybrid[1] == '-' and hybrid[4] == '-'  # no baseline, no ratio
    peers = cells("Peers (same weights, interleaved; peers in the baseline's precision)")
    assert set(peers) == {'row', 'tiny forward fp32', 'tiny forward bf16 vs mmdet fp32',
                          'tiny train bf16 AMP vs mmdet bf16'}
    assert peers['tiny forward fp32'][5] == '%.2f' % report['cases'][0]['rows'][0][
        'fastest_first_speedup']
    roof = cells('GEMM roofline')
    assert roof['hybrid forward fp32'][0] != '-' and roof['tiny forward fp32'][3] == '%.0f' % (
        100 * report['cases'][0]['rows'][0]['first_roof_ratio'])
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
    assert len(labels) == len(set(labels)) >= 25  # 25 Swin/Mask R-CNN/other rows, + DINOv2's
    metrics = [r[3] for c in standard for r in c['rows']]
    assert metrics.count('peak') == 4 and metrics.count('time') == len(labels) - 4
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


def test_plain_and_fast_flags_force_the_switch_during_the_call(tool):
    """' plain' / ' fast' run a variant with the layers' fast path forced off / on (an A/B of
    the switch in one process) and put the switch back as it was after each call."""
    from mmvitswin.core.layers import fast_path_active, set_fast_path, switch
    probe = torch.zeros(2)
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(fast_path_active(probe))
            return [x]
    device = torch.device('cpu')
    previous = set_fast_path(None)
    try:
        for name, expected in (('ours fp32 plain', False), ('ours fp32 fast', True)):
            for setting in (None, True, False):
                set_fast_path(setting)
                tool.make_variant_call('forward', Probe(), name, device)(torch.zeros(1, 3, 4, 4))
                assert seen.pop() is expected, (name, setting)
                assert switch._enabled is setting  # restored after the call
        set_fast_path(False)
        tool.make_variant_call('forward', Probe(), 'ours fp32', device)(torch.zeros(1, 3, 4, 4))
        assert seen.pop() is False  # no flag: the switch as it is
    finally:
        set_fast_path(previous)
    info = tool.machine_info(device)
    assert info['fast_path'] == switch.fast_path_setting()
    assert info['cpu_capability'] == switch.cpu_capability()
    # the oneDNN primitive cache the process runs with (the tool's room for every variant,
    # unless the environment set one first) is reported with the machine
    assert info['onednn_primitive_cache'] == int(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])


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


# ------------------------------------------------------------------ peers, roofline, profile
def test_peer_and_roofline_columns(run):
    """Each Swin time row carries the peers' times and the fastest-of ratio; each time row of a
    backbone case carries its FLOPs, the GEMM limit and the fraction of it reached."""
    _, report, _ = run
    fwd, train, hybrid = report['cases'][0], report['cases'][1], report['cases'][4]
    row = fwd['rows'][0]  # ours fp32 against mmdet fp32
    assert row['peers'] == ['timm fp32', 'hf fp32']
    v = fwd['variants']
    if hf_available():
        hf = sum(v['hf fp32']['first']) / len(v['hf fp32']['first'])
        assert row['hf_first_ms'] == pytest.approx(1e3 * hf)
        assert row['hf_first_speedup'] == pytest.approx(
            sum(v['hf fp32']['first']) / sum(v['ours fp32']['first']))
    assert ('hf_first_ms' in row) == hf_available() != ('hf_error' in row)
    others = ['ref fp32'] + (['hf fp32'] if hf_available() else []) + \
        (['timm fp32'] if timm_available() else [])
    best = min(sum(v[n]['first']) / len(v[n]['first']) for n in others)
    assert row['fastest_first_speedup'] == pytest.approx(
        best * len(v['ours fp32']['first']) / sum(v['ours fp32']['first']))
    assert ('timm_first_ms' in row) == timm_available() != ('timm_error' in row)
    assert train['rows'][0]['peers'] == ['timm bf16', 'hf bf16']  # the baseline's precision
    assert 'peers' not in train['rows'][1]  # a peak row
    # roofline: FLOPs at every size of the pass, the GEMM rate per precision the rows use
    roof = fwd['roofline']
    assert len(roof['flops']) == 2 and min(roof['flops']) > 0
    assert set(roof['gemm_gflops']) == {'fp32', 'bf16'} and min(roof['gemm_gflops'].values()) > 0
    achieved = sum(roof['flops']) / sum(v['ours fp32']['first']) / 1e9
    assert row['first_gflops'] == pytest.approx(achieved)
    assert row['first_roof_ratio'] == pytest.approx(achieved / roof['gemm_gflops']['fp32'])
    bf16 = fwd['rows'][1]
    assert bf16['roof_gflops'] == roof['gemm_gflops']['bf16']
    assert bf16['baseline_first_roof_ratio'] == pytest.approx(
        sum(roof['flops']) / sum(v['ref fp32']['first']) / 1e9 / roof['gemm_gflops']['fp32'])
    assert train['rows'][0]['gflop_per_call'] > 0 and train['rows'][0]['first_roof_ratio'] > 0
    # a backbone without peers still has its roofline
    h = hybrid['rows'][0]
    assert 'peers' not in h and h['gflop_per_call'] > 0 and h['first_roof_ratio'] > 0


def _tiny_swin(depths=(2, 2, 2, 2)):
    import mmvitswin  # noqa: F401
    from mmvitswin.openmmlab.registry import MODELS
    cfg = dict(type='SwinTransformer', embed_dims=32, depths=list(depths), num_heads=[1, 2, 4, 8],
               drop_path_rate=0.0)
    torch.manual_seed(0)
    model = MODELS.build(cfg).eval()
    with torch.no_grad():  # off their init (norms at 1, biases at 0): every tensor is checked
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return cfg, model


def test_peers_compute_our_features_from_our_weights(tool):
    """Our weights moved into HF's SwinBackbone and timm's Swin give our features: at 448 px
    (every stage a multiple of the window and larger than it, so neither peer pads or drops a
    shift) HF's maps equal ours, and timm's (NHWC, before the level norms) equal ours once our
    norm{i} is applied."""
    if not hf_available():
        pytest.skip('HF transformers is not installed (the tests extra has it for Python >= 3.10)')
    cfg, model = _tiny_swin()
    state = model.state_dict()
    x = torch.randn(1, 3, 448, 448)
    with torch.no_grad():
        ours = model(x)
        hf = tool.hf_swin(cfg, state).eval()(x)
        assert len(hf) == len(ours) == 4
        for a, b in zip(ours, hf):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
        if not timm_available():
            pytest.skip(tool.import_timm()[1])
        feats = tool.timm_swin(cfg, state, img_size=448).eval()(x)
        for i, (a, b) in enumerate(zip(ours, feats)):
            assert b.shape == a.permute(0, 2, 3, 1).shape
            torch.testing.assert_close(getattr(model, f'norm{i}')(b).permute(0, 3, 1, 2), a,
                                       atol=1e-4, rtol=1e-4)
    # gradients reach every peer parameter that ours has
    peer = tool.hf_swin(cfg, state)
    sum(f.square().mean() for f in peer(torch.randn(1, 3, 64, 96))).backward()
    assert all(p.grad is not None for n, p in peer.named_parameters() if 'layernorm.' not in n)


def test_peer_weight_transfer_refuses_what_it_cannot_place(tool):
    cfg, model = _tiny_swin(depths=(1, 1, 1, 1))
    state = dict(model.state_dict())
    state['stages.0.blocks.0.extra.weight'] = torch.ones(3)
    if hf_available():
        with pytest.raises(ValueError, match='without a place in the peer.*extra'):
            tool.hf_swin(cfg, state)
    linear = torch.nn.Linear(2, 2)  # the same refusal with any peer and conversion
    with pytest.raises(ValueError, match='without a place in the peer.*extra'):
        tool.load_from_ours(linear, dict(linear.state_dict(), extra=torch.ones(3)), dict)
    with pytest.raises(ValueError, match='use_abs_pos_embed'):
        tool.swin_kwargs(dict(cfg, use_abs_pos_embed=True), model.state_dict())
    with pytest.raises(ValueError, match='peer parameters left unset'):  # a probe ours lacks
        tool.load_from_ours(torch.nn.Linear(2, 2), {}, lambda sd: {})


def test_timm_stub_stays_in_the_import(tool):
    """The torchvision stub (where timm needs it) is gone from the process after timm's
    import: no import hook left, no stub module for anything else to find."""
    timm, note = tool.import_timm()
    assert not any(isinstance(f, tool._TorchvisionStub) for f in sys.meta_path)
    if timm is None:  # timm not installed (make install installs it), or broken even with the stub
        assert note.startswith('timm not benchmarked: import failed')
        assert not any(n.split('.')[0] in ('timm', 'torchvision') for n in sys.modules)
    else:
        assert note.startswith('timm 1.')
    if 'torchvision' not in note or timm is None:
        return
    # timm came in with the stub: neither the stub nor a torchvision module is left behind
    assert 'imported with a torchvision stub' in note
    assert not any(n.split('.')[0] == 'torchvision' for n in sys.modules)
    with pytest.raises(ImportError):
        import torchvision  # noqa: F401


def _swin_matmul_flops(model, h: int, w: int, c0: int = 32) -> int:
    """The matrix products of our Swin at a size where no stage pads (every side a multiple of
    the window), from the shapes: patch conv, qkv, q@k^T, attn@v, proj, fc1, fc2, merges."""
    win = 7
    total, c, hs, ws = 2 * (h // 4) * (w // 4) * 3 * 16 * c0, c0, h // 4, w // 4
    for s, stage in enumerate(model.stages):
        n = hs * ws
        total += len(stage.blocks) * (2 * n * c * 3 * c + 2 * 2 * n * win * win * c +
                                      2 * n * c * c + 2 * 2 * n * c * 4 * c)
        if stage.downsample is not None:
            hs, ws = hs // 2, ws // 2
            total += 2 * hs * ws * 4 * c * 2 * c
            c *= 2
    return total


def test_flop_count_matches_the_shapes(tool):
    """FlopCounterMode (with the CPU fused attention formula the tool adds) counts what the
    shapes say; a train step counts forward and backward (about three forwards)."""
    _, model = _tiny_swin()
    x = torch.randn(1, 3, 224, 224)
    assert tool.count_flops(model, x, train=False) == _swin_matmul_flops(model, 224, 224)
    model.train()
    train = tool.count_flops(model, x, train=True)
    assert 2.5 < train / _swin_matmul_flops(model, 224, 224) < 3.05
    assert all(p.grad is None for p in model.parameters())  # left as it was


def test_gemm_shapes_are_the_models_own(tool):
    """The recorder sees every GEMM a call runs, forward and backward, as (M, K, N, a^T, b^T),
    convolutions included; the rate is measured over them."""
    _, model = _tiny_swin()
    shapes = tool._gemm_shapes_mode()
    tool.count_flops(model, torch.randn(1, 3, 224, 224), train=False, shapes=shapes)
    counts = {k[:3]: c for k, c in shapes.counts.items()}
    assert counts[(56 * 56, 48, 32)] == 1  # patch embedding (4x4 conv as a GEMM)
    assert counts[(56 * 56, 32, 96)] == 2  # stage 1 qkv, two blocks
    assert counts[(14 * 14, 128, 512)] == 2  # stage 3 fc1
    linear = torch.nn.Linear(8, 16)
    shapes = tool._gemm_shapes_mode()
    with shapes:
        linear(torch.randn(32, 8, requires_grad=True)).backward(torch.randn(32, 16))
    assert {(32, 8, 16), (32, 16, 8), (16, 32, 8)} <= {k[:3] for k in shapes.counts}
    assert any(k[:3] == (16, 32, 8) and k[3] for k in shapes.counts)  # dW = dY^T @ X
    gemms, cpu = {(64, 32, 48, False, True): 3}, torch.device('cpu')
    rate = tool.gemm_rate(gemms, torch.float32, cpu)
    assert 0 < rate <= tool.gemm_rate(gemms, torch.float32, cpu, best=True)


def test_op_groups(tool):
    expected = {
        'aten::mm': 'GEMM', 'aten::addmm': 'GEMM', 'aten::bmm': 'GEMM',
        'aten::convolution_backward': 'GEMM', 'aten::mkldnn_convolution': 'GEMM',
        'aten::_scaled_dot_product_flash_attention_for_cpu': 'attention (SDPA)',
        'aten::_scaled_dot_product_flash_attention_for_cpu_backward': 'attention (SDPA)',
        'aten::_softmax': 'softmax', 'aten::_softmax_backward_data': 'softmax',
        'aten::copy_': 'layout copies', 'aten::roll': 'layout copies',
        'aten::index_select': 'layout copies', 'aten::constant_pad_nd': 'layout copies',
        'aten::cat': 'layout copies', 'aten::permute': 'layout copies',
        'aten::index': 'gather/scatter', 'aten::index_put_': 'gather/scatter',
        'aten::native_layer_norm': 'norms', 'aten::native_layer_norm_backward': 'norms',
        'aten::gelu': 'GELU', 'aten::gelu_backward': 'GELU', 'aten::_fused_adamw_': 'optimizer',
        'aten::add': 'other', 'aten::masked_fill': 'other', 'aten::empty': 'other'}
    assert {name: tool.op_group(name) for name in expected} == expected


def test_profile_mode(tmp_path):
    """--profile: every workload (forward, train step; fp32, bf16) profiled, its ops grouped,
    the groups summing to the ops' time, the table printed and written."""
    proc = subprocess.run([sys.executable, TOOL, '--profile', '--profile-model', 'swin_tiny_test',
                           '--profile-scale', '0.1', '--count', '1', '--threads', '1',
                           '--out-dir', str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / 'profile.json').read_text())
    work = report['workloads']
    assert [(w['kind'], w['dtype']) for w in work] == [
        ('forward', 'fp32'), ('forward', 'bf16'), ('train', 'fp32'), ('train', 'bf16')]
    for w in work:
        assert list(w['groups']) == report_groups() and w['groups']['GEMM'] > 0
        assert w['groups']['layout copies'] > 0 and w['wall_ms'] > 0
        assert sum(ms for _, _, ms in w['top_ops']) <= sum(w['groups'].values()) + 1e-6
    assert all(w['groups']['optimizer'] > 0 for w in work if w['kind'] == 'train')
    assert all(w['groups']['optimizer'] == 0 for w in work if w['kind'] == 'forward')
    text = (tmp_path / 'profile.md').read_text()
    assert text in proc.stdout and '| layout copies' in text and 'ours train step bf16' in text


def report_groups():
    return ['attention (SDPA)', 'softmax', 'GEMM', 'norms', 'GELU', 'layout copies',
            'gather/scatter', 'optimizer', 'other']


def test_every_swin_row_against_the_reference_gets_the_peers(tool):
    """make bench: each Swin-T backbone time row whose baseline is mmdet's is timed against
    timm and HF too (in the baseline's precision); ``--peers`` alone turns them off."""
    for argv, expect in (([], True), (['--peers'], False), (['--peers', 'hf'], True)):
        args, got = tool.parse_args(argv), 0
        for case in tool.PRESETS['standard']:
            rows = [dict(label=l, subject=s, baseline=b, metric=m) for l, s, b, m in case['rows']]
            tool.add_peers(rows, case, args)
            for r in rows:
                swin = (case['model'] == 'swin_t' and r['metric'] == 'time'
                        and (r['baseline'] or '').startswith('ref '))
                want = [f"{p} {r['baseline'].split()[1]}" for p in args.peers] \
                    if swin and expect else None
                assert r.get('peers') == want, r
                got += bool(want)
        assert got == (14 if expect else 0)  # compiled rows included: eager peers


@pytest.mark.parametrize('ffn_type', ['swiglu', 'mlp'])
def test_hf_dinov2_state_in_both_transformers_layouts(tool, ffn_type):
    """The HF DINOv2 reference is loaded in the module names of the installed transformers:
    the refactored ones (``attention.q_proj``, ``mlp.gate_proj``) or the earlier ones
    (``attention.attention.query``, ``mlp.weights_in``; 5.17 still has them). Either layout,
    read back by our own HF converter, gives our trunk's weights exactly."""
    from mmvitswin.core.backbones.vit import ViTAdapter
    from mmvitswin.core.checkpoint.vit import convert_hf_vit_state_dict
    torch.manual_seed(0)
    model = ViTAdapter(arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                 feedforward_channels=64), img_size=28, patch_size=14,
                       layer_scale_init_value=1e-5, num_register_tokens=2, ffn_type=ffn_type,
                       final_norm=True)
    ours = model.state_dict()
    new = tool.hf_dinov2_state(ours, 2)
    old = tool.hf_dinov2_legacy_names(new)
    assert 'encoder.layer.1.attention.attention.query.weight' in old
    assert not [k for k in old if '_proj.' in k]
    glu = 'encoder.layer.0.mlp.weights_in.weight'
    assert (glu in old) == (ffn_type == 'swiglu') and (glu not in new)
    for state in (new, old):
        back = convert_hf_vit_state_dict(state)
        assert set(back) <= set(ours)
        assert all(torch.equal(back[k], ours[k]) for k in back)
        assert not [k for k in ours if k not in back and k.startswith('blocks.')]

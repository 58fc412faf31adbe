"""tools/benchmark.py (tools/bench) measures what it claims: no speed or memory figure asserted,
times combined as the report says, peaks and kernel counts on work small enough to count."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

pytestmark = pytest.mark.slow(reason='runs the benchmark tool')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(ROOT, 'tools'))  # tools/bench, as tools/benchmark.py imports it
from bench import cli, harness, kernels, peers  # noqa: E402

HAS_HF = importlib.util.find_spec('transformers') is not None
# every kind of row, and a broken case; the detector in fp32 (its mmdet heads in bf16 are
# minutes long on a CPU without bf16 instructions, whatever the backbone)
TINY_CASES = """
- {model: swin_tiny_test, kind: forward, scale: 0.15, count: 2, batch: 1, rows: [
   [tiny fp32, ours fp32, ref fp32, time], [tiny bf16 vs ref fp32, ours bf16, ref fp32, time]]}
- {model: swin_tiny_test, kind: train, scale: 0.15, count: 1, batch: 2, rows: [
   [tiny train bf16, ours bf16, ref bf16, time], [tiny cp, ours fp32 cp, ours fp32, peak]]}
- {model: maskrcnn, kind: whole, scale: 0.12, count: 1, batch: 1,
   backbone_kwargs: {depths: [1, 1, 1, 1]}, rows: [[mask rcnn fp32, ours fp32, ref fp32, time],
   [demo layers, ours fp32 sep nhwc, ref fp32, time]]}
- {model: hybrid_vit_t, kind: forward, scale: 0.1, count: 1, batch: 1, backbone_kwargs: {
   num_layers: 2, cnn_depths: [1, 1, 1]}, rows: [[hybrid fp32, ours fp32, ref fp32, time]]}
- {model: no_such_model, kind: forward, scale: 0.1, count: 1, rows: [[x, ours fp32, null, time]]}
"""


def _load_tool():  # tests/test_swin_v2_timm.py imports timm as the tool does
    return peers


def _tool(*argv):
    return subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'benchmark.py'), *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_arguments_rows_sizes_and_peaks():
    with pytest.raises(SystemExit):
        cli.parse_args(['--count', '0'])
    case = dict(kind='forward', rows=[['a eager bf16', 'ours bf16', 'ref bf16', 'time'],
                                      ['b peak', 'ours fp32', 'ref fp32', 'peak']])
    rows = harness.case_rows(case, cli.parse_args(['--dtype', 'fp16', '--skip', 'peak']))
    assert [(r['label'], r['subject'], r['baseline']) for r in rows] == [
        ('a eager fp16', 'ours fp16', 'ref fp16')]
    assert [r['label'] for r in harness.case_rows(case, cli.parse_args(['--only', 'pea']))] \
        == ['b peak']
    assert {'standard', 'quick'} <= set(cli.PRESETS)
    for path in cli.PRESETS.values():  # every case names a model we have
        with open(path) as f:
            assert all(c['model'] in harness.MODELS or c['model'] == 'maskrcnn'
                       for c in yaml.safe_load(f))
    sizes = harness.draw_sizes(20, 1.0, seed=3)
    assert sizes == harness.draw_sizes(20, 1.0, seed=3) != harness.draw_sizes(20, 1.0, seed=4)
    assert all(h % 32 == w % 32 == 0 and 480 <= min(h, w) and max(h, w) <= 1344
               for h, w in sizes) and len(set(sizes)) == 20

    def call():  # 4 MiB, then 8 MiB more: the peak holds both
        a, b = torch.ones(2**20), torch.ones(2**21)
        del a, b
    assert harness.peak_bytes(call, torch.device('cpu')) == 3 * 2**22


def test_tiny_run_reports_every_kind_of_row(tmp_path):
    (tmp_path / 'cases.yaml').write_text(TINY_CASES)
    proc = _tool('--cases', str(tmp_path / 'cases.yaml'), '--out-dir', str(tmp_path))
    report = json.loads((tmp_path / 'benchmark.json').read_text())
    assert proc.returncode == 1 and report['errors'] == 1, proc.stderr[-3000:]  # the broken one
    fwd, train, whole, hybrid, broken = report['cases']
    variants = fwd['variants']
    for name in ('ours fp32', 'mmdet fp32', 'ours bf16'):  # both passes, every size
        assert len(variants[name]['first']) == len(variants[name]['again']) == 2
    row = fwd['rows'][1]
    assert row['reference'] == 'mmdet' and row['first_speedup'] == pytest.approx(
        sum(variants['mmdet fp32']['first']) / sum(variants['ours bf16']['first']))
    done = [p for p in row['peers'] if 'error' not in variants[p]]
    best = min(sum(variants[n]['first']) for n in ['mmdet fp32'] + done)
    assert row['fastest_first_speedup'] == pytest.approx(best / sum(
        variants['ours bf16']['first']))
    assert ('hf fp32' in done) == HAS_HF and train['rows'][0]['peers'] == ['timm bf16', 'hf bf16']
    peak = train['rows'][1]  # with_cp keeps fewer activations
    assert 0 < peak['peak_mib'] < peak['peak_mib_baseline'] and peak['peak_ratio'] == \
        pytest.approx(peak['peak_mib'] / peak['peak_mib_baseline'])
    assert all(r['first_ms'] > 0 and r['first_speedup'] > 0 for r in whole['rows'])
    assert hybrid['rows'][0]['first_ms'] > 0 and hybrid['rows'][0]['first_speedup'] is None
    assert broken['error'].startswith('KeyError')
    text = (tmp_path / 'benchmark.md').read_text()
    assert text in proc.stdout and '| tiny bf16 vs mmdet fp32 | ours bf16 | mmdet fp32 |' in text


@pytest.mark.skipif(torch.cuda.is_available(), reason='a real CUDA run, not a dry one')
def test_device_cuda_without_cuda_is_a_dry_run(tmp_path):
    proc = _tool('--device', 'cuda', '--preset', 'quick', '--out-dir', str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / 'benchmark.json').read_text())
    assert 'dry run (--device cuda without CUDA' in report['machine']
    assert report['cases'] and all(r['dry_run'] for c in report['cases'] for r in c['rows'])
    assert all(not v['first'] and ('error' not in v or n[:4] != 'ours')
               for c in report['cases'] for n, v in c['variants'].items())


def _perturbed(model):
    with torch.no_grad():  # off their init (norms at 1, biases at 0): every weight checked
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


@pytest.mark.skipif(not HAS_HF, reason='HF transformers is not installed')
@pytest.mark.parametrize('name', ['swin_tiny_test', 'swinv2_tiny_test'])
def test_peers_compute_our_features_from_our_weights(name):
    """Where every stage is a multiple of the window (no peer pads) the peers' maps, with our
    level norms where the peer has none, equal ours, shifted blocks included."""
    torch.manual_seed(0)
    ours = _perturbed(harness.build_ours(dict(harness.MODELS[name], depths=[2, 2, 2, 2],
                                              drop_path_rate=0.)))
    x = torch.randn(1, 3, *((224, 224) if name == 'swin_tiny_test' else (256, 256)))
    with torch.no_grad():
        want = ours(x)
        impls = ['hf', 'mmdet'] if name == 'swin_tiny_test' else ['hf']
        for impl in impls + ['timm'] * bool(peers.import_timm()[0]):  # the note says why not
            peer = peers.build_peer(impl, ours)
            peer.eval()  # (mmdet's train() returns None)
            for i, (a, b) in enumerate(zip(want, peer(x))):
                b = b if b.shape == a.shape else b.permute(0, 3, 1, 2)  # timm: NHWC
                if impl == 'timm' or name == 'swinv2_tiny_test' and impl == 'hf':
                    b = getattr(ours, f'norm{i}')(b.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
                torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4, msg=impl)


@pytest.mark.skipif(not HAS_HF, reason='HF transformers is not installed')
def test_dinov2_peers_are_our_trunk():
    torch.manual_seed(0)
    cfg = dict(harness.MODELS['vit_adapter_dinov2_tiny_test'], adapter=None, adapter_cfg=None)
    ours, x = _perturbed(harness.build_ours(cfg)), torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        want = ours(x)[-1]
        for impl in ['hf'] + ['timm'] * bool(peers.import_timm()[0]):
            tokens = peers.build_peer(impl, ours).eval()(x)[0][:, 1:]
            torch.testing.assert_close(tokens.transpose(1, 2).reshape(want.shape), want,
                                       atol=1e-4, rtol=1e-4, msg=impl)
    linear = nn.Linear(2, 2)
    with pytest.raises(ValueError, match='without a place in the peer.*extra'):
        peers.load_from_ours(linear, dict(linear.state_dict(), extra=torch.ones(3)), dict)
    with pytest.raises(ValueError, match='peer parameters left unset'):
        peers.load_from_ours(nn.Linear(2, 2), {}, lambda sd: {})


class _Attention(nn.Linear):  # SDPA with a learnt bias (the weight), as a window attention
    def forward(self, x):
        return F.scaled_dot_product_attention(x, x, x, attn_mask=self.weight)


class _HostSync(nn.Module):
    def forward(self, x):
        return x[x > 0]  # boolean indexing: a data-dependent shape


@pytest.mark.requires_torch((2, 3), 'efficient attention with a bias on the meta device')
def test_kernel_counter_counts_by_hand():
    with torch.device('meta'):
        linear = nn.Linear(8, 16)
    fwd = kernels.count(linear, (4, 8), train=False)  # t (a view) + addmm
    assert (fwd.kernels, fwd.ops, dict(fwd.names)) == (1, 2, {'addmm': 1})
    for _ in range(2):  # + loss, its seed, dW, db; counted again: no gradient accumulated
        step = kernels.count(linear, (4, 8), train=True)
        assert dict(step.names) == {'addmm': 1, 'sum': 2, 'ones_like': 1, 'mm': 1}
        assert step.kernels == 5 < step.ops
    table = kernels.count_kernels(batch=1, sizes=[(3, 3)], cases=[
        ('linear', lambda: nn.Linear(3, 4), ''), ('sync', _HostSync, '')])
    text = kernels.render_kernels(table, 1, cases=[])
    assert '| linear | 3x3 | forward | 1 (4) | no such model |' in text  # + 2 reshapes
    assert '| sync | 3x3 | forward | fails on meta: ' in text
    with torch.device('meta'):
        attention = _Attention(5, 5)
    for train in (False, True):  # SDPA: one fused kernel each way, not the math path of meta
        names = kernels.count(attention, (2, 3, 5, 8), train=train).names
        assert names['_scaled_dot_product_efficient_attention'] == 1
        assert names['_scaled_dot_product_efficient_attention_backward'] == train
        assert not {'bmm', '_softmax', '_safe_softmax'} & set(names)


def test_profile_mode(tmp_path):
    proc = _tool('--profile', '--profile-model', 'swin_tiny_test', '--profile-scale', '0.1',
                 '--count', '1', '--out-dir', str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = json.loads((tmp_path / 'profile.json').read_text())['cases']
    work = [(c['case']['kind'], n, v) for c in cases for n, v in c['variants'].items()]
    assert [w[:2] for w in work] == [('forward', 'ours fp32'), ('forward', 'ours bf16'),
                                     ('train', 'ours fp32'), ('train', 'ours bf16')]
    assert all(v['groups']['GEMM'] > 0 and len(v['first']) == 1 for _, _, v in work)
    assert [v['groups']['optimizer'] > 0 for _, _, v in work] == [False, False, True, True]
    assert '| layout copies |' in (tmp_path / 'profile.md').read_text()

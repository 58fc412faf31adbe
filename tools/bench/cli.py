"""The command line: a preset's cases (or ``--profile``, ``--count-kernels``), then the report:
``benchmark.md`` (the tables, also printed) and ``benchmark.json`` (every raw time) in
``--out-dir``. ``--dry-run``, implied by ``--device cuda`` where CUDA is missing, parses the
arguments and builds every variant of every case on the CPU, timing nothing."""
import argparse
import glob
import json
import os
import platform
import re
import sys
import time
import traceback

import torch

from . import harness, kernels, peers, profile

PRESETS = {os.path.basename(p)[:-5]: p for p in glob.glob(
    os.path.join(os.path.dirname(__file__), 'presets', '*.yaml'))}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Speed and memory of our backbones against their '
                                'peers (tools/bench).')
    add = p.add_argument
    add('--preset', choices=sorted(PRESETS), default='standard')
    add('--cases', help='a JSON or YAML file of cases (the presets\' schema) instead')
    add('--only', nargs='+', help='run only rows whose label contains one of these')
    add('--skip', nargs='+', help='leave out rows whose label contains one of these')
    add('--backbone', help='our backbone class replacing Swin-T in its cases')
    add('--backbone-kwargs', default='{}', help='JSON merged into that backbone\'s arguments')
    add('--reference', choices=['mmdet', 'mmseg', 'none'], default='mmdet',
        help="whose Swin V1 is 'ref' (Swin V2, DINOv2: HF's model)")
    add('--dtype', choices=['bf16', 'fp16'], default='bf16', help='the autocast rows\' precision')
    add('--compile', action='store_true', help='compile every variant\'s blocks')
    add('--count', type=int, help='sizes per pass, for every case')
    add('--device', default='cpu')
    add('--dry-run', action='store_true', help='build every variant, time nothing')
    add('--threads', type=int, help='torch threads (default: every usable CPU)')
    add('--seed', type=int, default=0)
    add('--out-dir', default='bench_out')
    add('--peers', nargs='*', default=list(peers.PEERS), choices=peers.PEERS,
        help='timed beside the reference (default: timm hf; none: --peers alone)')
    add('--no-roofline', action='store_true', help='accepted; the GEMM roofline was dropped')
    add('--count-kernels', action='store_true', help='kernels per call on the meta device')
    add('--kernel-batch', type=int, default=2)
    add('--profile', action='store_true', help='op groups of forward and train step')
    add('--profile-model', default='swin_t', choices=sorted(harness.MODELS))
    add('--profile-impls', nargs='+', default=['ours'], choices=['ours', 'ref', 'mmdet', 'timm',
                                                                 'hf'])
    add('--profile-scale', type=float, default=1.0, help='of the recipe sizes')
    add('--profile-batch', type=int, default=1)
    args = p.parse_args(argv)
    if args.count is not None and args.count < 1:
        p.error('--count must be >= 1')
    return args


def load_cases(args) -> list:
    import yaml
    with open(args.cases or PRESETS[args.preset]) as f:
        cases = yaml.safe_load(f)  # JSON is YAML too
    if args.backbone or args.backbone_kwargs != '{}':
        harness.MODELS['custom'] = dict(harness.MODELS['swin_t'], **json.loads(
            args.backbone_kwargs), **({'type': args.backbone} if args.backbone else {}))
        for case in cases:
            case['model'] = 'custom' if case['model'] == 'swin_t' else case['model']
    return cases


def machine(device, note: str = '') -> str:
    cpu = next((ln.split(':', 1)[1].strip() for ln in open('/proc/cpuinfo')
                if ln.startswith('model name')), platform.processor())
    gpu = f', {torch.cuda.get_device_name(device)}' if device.type == 'cuda' else ''
    return (f'{cpu}, {len(os.sched_getaffinity(0))} usable CPUs, {torch.get_num_threads()} torch '
            f'threads, device {device}{gpu}; torch {torch.__version__}; load average '
            f'{os.getloadavg()[0]:.1f}{note}')


def table(head, rows) -> str:
    return '\n'.join('| ' + ' | '.join(map(str, r)) + ' |'
                     for r in [head, ['---'] * len(head)] + rows)


def _f(value, digits=1):
    return '-' if value is None else f'{value:.{digits}f}'


def _cells(r: dict) -> list:
    """A row's label, subject and baseline ('ref' spelled as the reference's package), then
    its figures."""
    names = [re.sub(r'\bref\b', r.get('reference') or 'ref', n) if n else '-'
             for n in (r['label'], r['subject'], r['baseline'])]
    names[2] += ' (failed)' * bool(r.get('baseline_error'))
    if 'error' in r or r.get('dry_run'):
        return names + [f"error: {r['error'][:60]}" if 'error' in r else 'dry run']
    if r['metric'] == 'peak':
        return names + [_f(r['peak_mib']), _f(r['peak_mib_baseline']), _f(r['peak_ratio'], 2)]
    return names + [_f(r[k.format(p)], d) for p in ('first', 'again') for k, d in (
        ('{}_ms', 1), ('{}_ms_baseline', 1), ('{}_speedup', 2), ('fastest_{}_speedup', 2))] + [
        ', '.join(f"{n.split()[0]} {_f(r[n.split()[0] + '_first_ms'])}" for n in r['peers'])
        or '-']


def render(report: dict) -> str:
    rows = [r for c in report['cases'] for r in c.get('rows', [])]
    lines = [f"# mmvitswin benchmark ({report['preset']})", '', report['machine'], '',
             "Time: mean ms per call over a pass's sizes (new sizes, then the same again); "
             'speed-up = baseline / subject; vs fastest = the fastest of baseline and peers / '
             'subject (> 1: faster than every one). Peak: memory increase of one call at the '
             'largest size; ratio = subject / baseline.', '']
    head = ['row', 'subject', 'baseline']
    for metric, title, more in (
            ('time', 'Time', [f'{p}: {k}' for p in ('new', 'seen') for k in (
                'subj ms', 'base ms', 'speed-up', 'vs fastest')] + ['new: peers ms']),
            ('peak', 'Peak memory', ['subj MiB', 'base MiB', 'ratio'])):
        got = [_cells(r) for r in rows if r['metric'] == metric]
        lines += [f'## {title}', '', table(head + more, got), ''] if got else []
    lines += [f'- {peers.NOTE}', f'- {peers.import_timm()[1]}']
    for c in report['cases']:
        what = f"{c['case']['model']} {c['case']['kind']}"
        if c.get('error'):
            lines.append(f"- error in case {what}: {c['error']}")
        lines += [f'- {what}, {name}: {v["error"]}' for name, v in c.get('variants', {}).items()
                  if 'error' in v]
        if c.get('sizes'):
            lines.append(f'- sizes of {what} (warm-up first): ' + ', '.join(
                f'{h}x{w}' for h, w in c['sizes'][:12]))
    return '\n'.join(lines) + '\n'


def _write(out_dir: str, name: str, text: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), 'w') as f:
        f.write(text)
    if name.endswith('.md'):
        print(text)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ['--peak-child']:
        return harness.peak_child()
    args = parse_args(argv)
    device, note = torch.device(args.device), '; dry run (--dry-run)' if args.dry_run else ''
    if device.type == 'cuda' and not torch.cuda.is_available():
        args.dry_run, device = True, torch.device('cpu')
        note = '; dry run (--device cuda without CUDA: every variant built on the CPU)'
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    if device.type == 'cuda':  # fp32 rows in fp32, as on the CPU
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    if args.count_kernels:
        text = kernels.render_kernels(kernels.count_kernels(args.kernel_batch),
                                      args.kernel_batch)
        _write(args.out_dir, 'kernels.md', f'{machine(device)}\n\n{text}')
        return 0
    if args.profile:
        return profile.profile_main(args, device, machine(device, note), table, _write)
    start, errors = time.perf_counter(), 0
    report = dict(preset=args.cases or args.preset, settings=vars(args), cases=[])
    for case in load_cases(args):
        try:
            record = harness.run_case(case, args, device)
        except Exception as exc:  # noqa: BLE001  (one broken case must not lose the others)
            traceback.print_exc()
            record = dict(case=case, error=f'{type(exc).__name__}: {exc}'.splitlines()[0][:300],
                          rows=[dict(label=r[0], subject=r[1], baseline=r[2], metric=r[3],
                                     error=type(exc).__name__) for r in case['rows']])
        errors += 'error' in record or any(  # a peer or reference missing is no error
            'error' in v and (n.startswith('ours') or 'not built' not in v['error'])
            for n, v in record.get('variants', {}).items())
        report['cases'].append(record)
        for row in record['rows']:
            print(f"[bench] {row['label']}: " + ', '.join(
                f'{k} {v:.2f}' for k, v in row.items() if isinstance(v, float)),
                file=sys.stderr, flush=True)
    report.update(wall_s=time.perf_counter() - start, errors=errors,
                  machine=machine(device, note) + f'; {time.perf_counter() - start:.0f} s')
    _write(args.out_dir, 'benchmark.json', json.dumps(report, indent=1, default=str))
    _write(args.out_dir, 'benchmark.md', render(report))
    return 1 if errors else 0

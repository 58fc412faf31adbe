"""The command line: the cases, then ``benchmark.md`` (the tables, also printed) and
``benchmark.json`` (every raw time) in ``--out-dir``. ``--device cuda`` without CUDA is a dry
run: every variant of every case built on the CPU, nothing timed."""
import argparse
import glob
import json
import os
import platform
import sys
import time
import traceback

import torch
import yaml

from . import harness, kernels, peers, profile

PRESETS = {os.path.basename(p)[:-5]: p for p in glob.glob(
    os.path.join(os.path.dirname(__file__), 'presets', '*.yaml'))}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Our backbones against their peers: see '
                                'docs/performance.md.')
    add = p.add_argument
    add('--preset', choices=sorted(PRESETS), default='standard')
    add('--cases', help="a YAML (or JSON) file of cases in the presets' schema")
    add('--only', nargs='+', help='run only rows whose label contains one of these')
    add('--skip', nargs='+', help='leave out rows whose label contains one of these')
    add('--dtype', choices=['bf16', 'fp16'], default='bf16', help='of autocast rows')
    add('--count', type=int, help='sizes per pass, for every case')
    add('--device', default='cpu')
    add('--seed', type=int, default=0, help='of the drawn sizes and inputs')
    add('--out-dir', default='bench_out')
    add('--count-kernels', action='store_true', help='kernels per call on meta')
    add('--profile', action='store_true', help='op groups of forward and train step')
    add('--profile-model', default='swin_t', choices=sorted(harness.MODELS))
    add('--profile-impls', nargs='+', default=['ours'],
        choices=['ours', 'ref', 'mmdet', 'timm', 'hf'])
    add('--profile-scale', type=float, default=1.0, help='of the recipe sizes')
    add('--profile-batch', type=int, default=1)
    args = p.parse_args(argv)
    if args.count is not None and args.count < 1:
        p.error('--count must be >= 1')
    return args


def machine(device, note: str = '') -> str:
    cpu = next((ln.split(':', 1)[1].strip() for ln in open('/proc/cpuinfo')
                if ln.startswith('model name')), platform.processor())
    gpu = f' ({torch.cuda.get_device_name(device)})' if device.type == 'cuda' else ''
    return (f'{cpu}, {torch.get_num_threads()} torch threads, device {device}{gpu}; torch '
            f'{torch.__version__}; load average {os.getloadavg()[0]:.1f}{note}')


def table(head, rows) -> str:
    return '\n'.join('| ' + ' | '.join(map(str, r)) + ' |'
                     for r in [head, ['---'] * len(head)] + rows)


def _cells(r: dict) -> list:
    """A row's label, subject, baseline and figures."""
    def f(value, digits=1):
        return '-' if value is None else f'{value:.{digits}f}'
    names = [r[k] or '-' for k in ('label', 'subject', 'baseline')]
    names[2] += ' (failed)' * bool(r.get('baseline_error'))
    if 'error' in r or r.get('dry_run'):
        return names + [f"error: {r['error'][:60]}" if 'error' in r else 'dry run']
    if r['metric'] == 'peak':
        return names + [f(r['peak_mib']), f(r['peak_mib_baseline']), f(r['peak_ratio'], 2)]
    return names + [f(r[k.format(p)], d) for p in ('first', 'again') for k, d in (
        ('{}_ms', 1), ('{}_ms_baseline', 1), ('{}_speedup', 2), ('fastest_{}_speedup', 2))] + [
        ', '.join(f"{n.split()[0]} {f(r[n.split()[0] + '_first_ms'])}" for n in r['peers'])
        or '-']


def render(report: dict) -> str:
    rows = [r for c in report['cases'] for r in c.get('rows', [])]
    lines = [f"# mmvitswin benchmark ({report['preset']})", '', report['machine'], '',
             "Time: mean ms per call over a pass's new sizes, then over them seen again; speed-up "
             '= baseline / subject; vs fastest = the fastest of baseline and peers / subject. '
             'Peak: tensor memory of one call at the largest size; ratio = subject / baseline.',
             '']
    for metric, title, more in (
            ('time', 'Time', [f'{p}: {k}' for p in ('new', 'seen') for k in (
                'subj ms', 'base ms', 'speed-up', 'vs fastest')] + ['new: peers ms']),
            ('peak', 'Peak memory', ['subj MiB', 'base MiB', 'ratio'])):
        got = [_cells(r) for r in rows if r['metric'] == metric]
        if got:
            lines += [f'## {title}', '', table(['row', 'subject', 'baseline'] + more, got), '']
    lines.append(f'- {peers.import_timm()[1]}')
    for c in report['cases']:
        what = f"{c['case']['model']} {c['case']['kind']}"
        lines += [f"- error in case {what}: {c['error']}"] if 'error' in c else []
        lines += [f'- {what}, {name}: {v["error"]}' for name, v in c.get('variants', {}).items()
                  if 'error' in v]
        lines += [f'- sizes of {what} (warm-up first): ' + ', '.join(
            f'{h}x{w}' for h, w in c['sizes'][:12])] if c.get('sizes') else []
    return '\n'.join(lines) + '\n'


def write(out_dir: str, name: str, text: str) -> None:
    """``text`` to ``out_dir/name``; markdown is also printed."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), 'w') as f:
        f.write(text)
    if name.endswith('.md'):
        print(text)


def run_cases(cases: list, args, device, dry_run: bool, probe=None) -> dict:
    report = dict(settings=vars(args), cases=[], errors=0)
    for case in cases:
        try:
            record = harness.run_case(case, args, device, dry_run, probe)
        except Exception as exc:  # noqa: BLE001  (one broken case must not lose the others)
            traceback.print_exc()
            record = dict(case=case, error=harness.error_text(exc), rows=[
                dict(r, error=type(exc).__name__) for r in harness.case_rows(case, args)])
        report['errors'] += 'error' in record or any(  # a peer or reference missing is no error
            'error' in v and (n.startswith('ours') or 'not built' not in v['error'])
            for n, v in record.get('variants', {}).items())
        report['cases'].append(record)
        for row in record['rows']:
            print(f"[bench] {row['label']}: " + ', '.join(
                f'{k} {v:.2f}' for k, v in row.items() if isinstance(v, float)),
                file=sys.stderr, flush=True)
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    device, note, dry_run = torch.device(args.device), '', False
    if device.type == 'cuda' and not torch.cuda.is_available():
        device, dry_run = torch.device('cpu'), True
        note = '; dry run (--device cuda without CUDA: every variant built on the CPU)'
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    if device.type == 'cuda':  # fp32 rows in fp32, as on the CPU
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    if args.count_kernels:
        text = kernels.render_kernels(kernels.count_kernels(), batch=2)
        write(args.out_dir, 'kernels.md', f'{machine(device)}\n\n{text}')
        return 0
    start, name = time.perf_counter(), 'profile' if args.profile else 'benchmark'
    if args.profile:
        cases, title = profile.cases(args), f'{args.profile_model}, batch {args.profile_batch}'
    else:
        with open(args.cases or PRESETS[args.preset]) as f:
            cases, title = yaml.safe_load(f), args.cases or args.preset
    report = dict(run_cases(cases, args, device, dry_run, profile.probe if args.profile
                            else None), preset=title)
    report['machine'] = machine(device, note) + f'; {time.perf_counter() - start:.0f} s'
    text = profile.render_profile(report, table) if args.profile else render(report)
    write(args.out_dir, f'{name}.json', json.dumps(report, indent=1, default=str))
    write(args.out_dir, f'{name}.md', text)
    return 1 if report['errors'] else 0

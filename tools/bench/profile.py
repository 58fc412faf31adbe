"""``--profile``: where a call's time goes, by op group, for ours and the peers.

torch.profiler over ``--count`` new sizes (after a warm-up at another) for each implementation
(``--profile-impls``), kind (forward, train step) and precision (fp32, ``--dtype``). Each op's
self time (device time on a GPU) goes to the first :data:`GROUPS` entry with a fragment of its
name ('other' takes the rest; ops run inside ``Optimizer.step``: 'optimizer'). On a GPU also:
kernel launches per call, host syncs of one call (``torch.cuda.set_sync_debug_mode``) and the
forward's largest relative error against the CPU on the same weights (CUDA's kernels return
layouts the CPU's never do). Needs torch, and the peers' packages, only.
"""
import json
import sys
import time
import traceback
import warnings

import torch

from .harness import Subject, draw_sizes, make_call, sync

GROUPS = (  # (group, fragments of profiler op names)
    ('attention (SDPA)', ('scaled_dot_product', 'flash_attention', 'efficient_attention')),
    ('softmax', ('softmax', )),
    ('GEMM', ('::mm', '::addmm', '::bmm', '::baddbmm', '::matmul', '::linear', 'conv', 'gemm')),
    ('norms', ('layer_norm', 'group_norm', 'batch_norm', 'rms_norm')),
    ('GELU', ('gelu', )),
    ('optimizer', ('_fused_adam', '_foreach_', 'Optimizer.')),
    ('gather/scatter', ('::index', 'gather', 'scatter', 'embedding')),
    ('layout copies', ('copy', 'clone', 'contiguous', 'permute', 'transpose', 'roll', '::cat',
                       'pad', 'reshape', 'view', 'expand', 'slice', 'select', 'split', 'unbind',
                       'stack', 'unfold', 'im2col', 'col2im', 'squeeze', 'narrow', 'alias')),
)
ORDER = [g for g, _ in GROUPS] + ['other']


def op_group(name: str) -> str:
    """The :data:`GROUPS` group of a profiler event name (``aten::mm`` -> 'GEMM')."""
    return next((g for g, fragments in GROUPS if any(f in name for f in fragments)), 'other')


def group_profile(events, calls: int, cuda: bool):
    """ms per call of each group (self times of profiler ``events``), and the ops by time."""
    groups, ops = dict.fromkeys(ORDER, 0.0), {}
    for e in events:
        ms = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e3 / calls
        parent, group = e.cpu_parent, op_group(e.name)
        while parent is not None and group != 'optimizer':
            group = 'optimizer' if parent.name.startswith('Optimizer.step') else group
            parent = parent.cpu_parent
        groups[group] += ms
        ops[e.name] = ops.get(e.name, 0.0) + ms
    return groups, sorted(ops.items(), key=lambda o: -o[1])


def _gpu_checks(subject, name: str, call, x, entry: dict) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        torch.cuda.set_sync_debug_mode(1)  # a warning per host sync
        try:
            call(x)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    entry['host_syncs'] = len(caught)
    if subject.case['kind'] == 'forward' and name.split()[1] == 'fp32':
        model = subject.variant(name).eval()
        with torch.no_grad():
            got, want = [o.float().cpu() for o in model(x)], model.cpu()(x.cpu())
        err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, want))
        entry['rel_err_vs_cpu'] = f'{err:.1e}'


def profile_workloads(args, device) -> list:
    from torch.profiler import ProfilerActivity, profile
    cuda, out = device.type == 'cuda', []
    sizes = draw_sizes((args.count or 2) + 1, args.profile_scale, args.seed)
    for kind in ('forward', 'train'):
        subject = Subject(dict(model=args.profile_model, kind=kind, batch=args.profile_batch),
                          args, device)
        inputs = [subject.make_input(s, i) for i, s in enumerate(sizes)]
        for name in [f'{i} {d}' for i in args.profile_impls for d in dict.fromkeys(
                ('fp32', args.dtype))]:
            entry = dict(name=name, kind=kind, sizes=sizes)
            try:
                call = make_call(subject.case, subject.variant(name), name, device)
                if args.dry_run:
                    out.append(dict(entry, error='dry run: built, not profiled'))
                    continue
                call(inputs[0])
                with profile(activities=[ProfilerActivity.CPU] +
                             [ProfilerActivity.CUDA] * cuda) as prof:
                    start = time.perf_counter()
                    for x in inputs[1:]:
                        call(x)
                    sync(device)
                    wall = time.perf_counter() - start
                groups, ops = group_profile(prof.events(), len(inputs) - 1, cuda)
                entry.update(wall_ms=1e3 * wall / (len(inputs) - 1), groups=groups,
                             top_ops=ops[:15])
                if cuda:
                    entry['kernel_launches'] = sum(e.count for e in prof.key_averages() if
                                                   e.device_type.name == 'CUDA') / (len(inputs) - 1)
                    _gpu_checks(subject, name, call, inputs[1], entry)
            except Exception as exc:  # noqa: BLE001  (one workload must not lose the rest)
                traceback.print_exc()
                entry['error'] = f'{type(exc).__name__}: {exc}'.splitlines()[0][:200]
            out.append(entry)
            print(f"[profile] {kind} {name}: {entry.get('error') or entry['wall_ms']}",
                  file=sys.stderr, flush=True)
    return out


def render_profile(report: dict, table) -> str:
    ok = [w for w in report['workloads'] if 'error' not in w]
    heads = [f"{w['name'].split()[0]} {w['kind'].replace('train', 'train step')} "
             f"{w['name'].split()[1]}" for w in ok]
    rows = [[g] + [f"{w['groups'][g]:.1f} ({100 * w['groups'][g] / sum(w['groups'].values()):.0f}"
                   ' %)' for w in ok] for g in ORDER]
    rows.append(['wall per call'] + [f"{w['wall_ms']:.1f}" for w in ok])
    for key in ('kernel_launches', 'host_syncs', 'rel_err_vs_cpu'):
        rows += [[key.replace('_', ' ')] + [w.get(key, '-') for w in ok]] * any(key in w
                                                                               for w in ok)
    sizes = report['workloads'][0]['sizes']
    return '\n'.join([
        f"# mmvitswin profile: {report['model']}", '', report['machine'], '',
        f'ms per call (op self times per group, % of their sum), mean over {len(sizes) - 1} new '
        f"sizes after a warm-up; batch {report['batch']}.", '', table(['group'] + heads, rows),
        '', '- sizes (warm-up first): ' + ', '.join(f'{h}x{w}' for h, w in sizes)] + [
        f'- top ops, {h}: ' + ', '.join(f"{n.split('::')[-1]} {ms:.1f}"
                                        for n, ms in w['top_ops'][:8]) for h, w in zip(heads, ok)
    ] + [f"- {w['kind']} {w['name']}: {w['error']}" for w in report['workloads']
         if 'error' in w]) + '\n'


def profile_main(args, device, machine: str, table, write) -> int:
    """``profile.md`` and ``profile.json`` in ``--out-dir``."""
    report = dict(model=args.profile_model, batch=args.profile_batch, machine=machine,
                  settings=vars(args), workloads=profile_workloads(args, device))
    write(args.out_dir, 'profile.json', json.dumps(report, indent=1, default=str))
    write(args.out_dir, 'profile.md', render_profile(report, table))
    return int(any('error' in w and not args.dry_run for w in report['workloads']))

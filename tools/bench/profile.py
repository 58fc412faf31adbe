"""``--profile``: where a call's time goes, by op group, for ours and the peers.

Harness cases (forward, train step) of ``--profile-model``, a variant per implementation
(``--profile-impls``) and precision (fp32, ``--dtype``), each call of the new-sizes pass under
torch.profiler (:func:`probe`); on a GPU also kernel launches and host syncs per call.
"""
import warnings
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

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


def cases(args) -> list:
    """The harness cases of ``--profile``: one row per variant, timed alone."""
    names = [f'{i} {d}' for i in args.profile_impls for d in dict.fromkeys(('fp32', args.dtype))]
    return [dict(model=args.profile_model, kind=kind, scale=args.profile_scale,
                 count=args.count or 2, batch=args.profile_batch,
                 rows=[[n, n, None, 'time'] for n in names]) for kind in ('forward', 'train')]


def op_group(name: str, parent) -> str:
    """The group of profiler event ``name`` under event ``parent``: 'optimizer' inside
    ``Optimizer.step``, else the first of :data:`GROUPS` with a fragment of the name; 'other'."""
    while parent is not None:
        if parent.name.startswith('Optimizer.step'):
            return 'optimizer'
        parent = parent.cpu_parent
    return next((g for g, fragments in GROUPS if any(f in name for f in fragments)), 'other')


@contextmanager
def probe(record: dict, device):
    """Profiles the call run inside it into a variant's ``record``: ms of self time (device
    time on a GPU) by group and by op, and on a GPU kernel launches and host syncs (sums)."""
    cuda = device.type == 'cuda'
    with warnings.catch_warnings(record=True) as caught, profile(activities=[
            ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        warnings.simplefilter('always')
        if cuda:
            torch.cuda.set_sync_debug_mode(1)  # a warning per host sync
        try:
            yield
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    groups = record.setdefault('groups', dict.fromkeys(ORDER, 0.0))
    ops = record.setdefault('ops', {})
    for e in prof.events():
        ms = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e3
        groups[op_group(e.name, e.cpu_parent)] += ms
        ops[e.name] = ops.get(e.name, 0.0) + ms
    if cuda:
        record['kernel_launches'] = record.get('kernel_launches', 0) + sum(
            e.count for e in prof.key_averages() if e.device_type.name == 'CUDA')
        record['host_syncs'] = record.get('host_syncs', 0) + sum(
            'synchroniz' in str(w.message) for w in caught)


def render_profile(report: dict, table) -> str:
    cols = [(f"{n.split()[0]} {c['case']['kind'].replace('train', 'train step')} "
             f"{n.split()[1]}", v, len(v['first'])) for c in report['cases']
            for n, v in c.get('variants', {}).items() if v.get('first') and 'groups' in v]
    rows = [[g] + [f"{v['groups'][g] / k:.1f} ({v['groups'][g] / sum(v['groups'].values()):.0%})"
                   for _, v, k in cols] for g in ORDER]
    rows += [['wall per call'] + [f"{1e3 * sum(v['first']) / k:.1f}" for _, v, k in cols]] + [
        [key.replace('_', ' ')] + [f"{v.get(key, 0) / k:.1f}" for _, v, k in cols]
        for key in ('kernel_launches', 'host_syncs') if any(key in v for _, v, _ in cols)]
    sizes = report['cases'][0].get('sizes', [])
    return '\n'.join([
        f"# mmvitswin profile: {report['preset']}", '', report['machine'], '',
        f'ms per call (op self times per group, % of their sum), mean over {len(sizes) - 1} new '
        'sizes after a warm-up.', '', table(['group'] + [h for h, _, _ in cols], rows), '',
        '- sizes (warm-up first): ' + ', '.join(f'{h}x{w}' for h, w in sizes)] + [
        f'- top ops, {h}: ' + ', '.join(f"{n.split('::')[-1]} {ms / k:.1f}" for n, ms in sorted(
            v['ops'].items(), key=lambda o: -o[1])[:8]) for h, v, k in cols] + [
        f"- {c['case']['kind']} {n}: {v['error']}" for c in report['cases']
        for n, v in c.get('variants', {}).items() if 'error' in v] + [
        f"- {c['case']['kind']}: {c['error']}" for c in report['cases'] if 'error' in c]) + '\n'

"""Where a GPU forward's time goes: ``tools/gpu_check.sh profile`` (torch + transformers only).

1. the window backbones' batch-1 fp32 inference on the GPU against the same weights on the CPU
   (CUDA's attention kernels return a memory layout the CPU's never do);
2. SwinV2-T (ours, and HF's ``Swinv2Backbone`` on the same weights) and Swin-T, batch 1, fp32
   and bf16 autocast: mean ms at new sizes (recipe x0.4, seed 101), then at the same sizes again,
   interleaved; the forward, then the train step (the benchmark's: loss, backward, fused
   AdamW; bf16 with autocast). Then the same for SwinV2-T at what a detection run feeds a GPU
   (batch 2 at the recipe's sizes: short sides 480-800 px), where the kernels, not the host
   issuing them, set the time;
3. the host synchronisations of one forward (``torch.cuda.set_sync_debug_mode``), by line;
4. ``torch.profiler`` tables (self CPU, self CUDA) of one call at a new and at a seen size,
   with the kernel launches and aten calls counted.

Writes ``log.txt``, ``times_forward.json``, ``times_train.json`` and ``profiles.txt`` under
``$OUT`` (default ``build/gpu_profile_out``). Without a GPU it runs the same steps on the CPU
at smaller sizes (a dry run of the script).
"""
import importlib.util
import json
import os
import sys
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mmvitswin.core import SwinTransformer, SwinTransformer3D, SwinTransformerV2  # noqa: E402

DEV = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
DRY = DEV.type == 'cpu'
OUT = os.environ.get('OUT') or os.path.join(ROOT, 'build', 'gpu_profile_out')
START = time.time()


def _load_benchmark():
    spec = importlib.util.spec_from_file_location('benchmark', os.path.join(ROOT, 'tools',
                                                                           'benchmark.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sync():
    if DEV.type == 'cuda':
        torch.cuda.synchronize()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def check_layout(log):
    torch.manual_seed(0)
    cases = [('Swin-T', SwinTransformer(), (1, 3, 200, 328)),
             ('SwinV2-T', SwinTransformerV2(arch='tiny', window_size=16), (1, 3, 200, 328)),
             ('Video Swin-T', SwinTransformer3D(arch='tiny', out_indices=(0, 1, 2, 3)),
              (1, 3, 4, 96, 136))]
    for name, model, shape in cases:
        x = torch.randn(shape)
        model.eval()
        try:
            with torch.no_grad():
                ref = model(x)
                got = [o.cpu() for o in model.to(DEV)(x.to(DEV))]
            log(f'layout {name} fp32 batch 1, rel err against the CPU per stage:',
                [f'{rel_err(a, b):.1e}' for a, b in zip(got, ref)])
        except Exception as exc:  # report and go on: the other steps still say something
            log(f'layout {name} FAILED: {type(exc).__name__}: {str(exc)[:200]}')


def time_sizes(bench, models, log, kind='forward', batch=1, scale=0.4, count=9):
    """Mean ms per call of each model at ``count`` new sizes (the recipe's scaled by
    ``scale``), then at the same sizes again; ``log`` lines and ``times_<kind>[_b<batch>].json``
    (the dry run: a third of the count at a fraction of the scale)."""
    sizes = bench.draw_sizes(max(2, count // 3) if DRY else count,
                             scale * 0.375 if DRY else scale, 101)
    tag = f'{kind} batch {batch}' if batch != 1 else kind
    times = {}
    for dtype in ('fp32', 'bf16'):
        for m in models.values():
            m.train(kind == 'train')
        calls = {name: bench.make_call(kind, m, dtype, DEV, fused=kind == 'train')
                 for name, m in models.items()}
        inputs = [torch.randn(batch, 3, *s, device=DEV) for s in sizes]
        for call in calls.values():  # warm-up at a size that is not timed
            call(torch.randn(batch, 3, 160, 160, device=DEV))
        sync()
        for seen in ('new', 'seen'):
            for x in inputs:
                for name, call in calls.items():
                    sync()
                    t = time.perf_counter()
                    call(x)
                    sync()
                    times.setdefault(f'{dtype} {seen} {name}', []).append(
                        (time.perf_counter() - t) * 1e3)
        for name in calls:
            new, again = times[f'{dtype} new {name}'], times[f'{dtype} seen {name}']
            log(f'{tag} {dtype} {name}: new sizes {sum(new) / len(new):.1f} ms '
                f'(min {min(new):.1f}, max {max(new):.1f}); seen {sum(again) / len(again):.1f} '
                f'ms (min {min(again):.1f})')
    for m in models.values():
        m.eval()
    log('sizes', sizes)
    name = f'times_{kind}' + (f'_b{batch}' if batch != 1 else '')
    with open(os.path.join(OUT, f'{name}.json'), 'w') as f:
        json.dump(dict(sizes=sizes, batch=batch, times=times), f)


def count_syncs(bench, models, log):
    for dtype in ('bf16', 'fp32'):
        for i, (name, model) in enumerate(models.items()):
            call = bench.make_call('forward', model, dtype, DEV)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter('always')
                torch.cuda.set_sync_debug_mode(1)
                try:
                    call(torch.randn(1, 3, 288, 448 + 32 * i, device=DEV))
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            where = {}
            for w in caught:
                key = f'{os.path.relpath(w.filename, ROOT)}:{w.lineno}'
                where[key] = where.get(key, 0) + 1
            log(f'syncs {dtype} {name}: {len(caught)}',
                sorted(where.items(), key=lambda kv: -kv[1])[:6])


def profiles(bench, models, log):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.type == 'cuda'
                                           else [])
    k = 0
    with open(os.path.join(OUT, 'profiles.txt'), 'w') as out:
        for dtype in ('bf16', 'fp32'):
            for name, model in models.items():
                call = bench.make_call('forward', model, dtype, DEV)
                for seen in ('new', 'seen'):
                    if time.time() - START > (100 if DRY else 190):
                        log('profiles: out of time')
                        return
                    k += 1
                    x = torch.randn(1, 3, 256 + 32 * (k % 7), 416 + 32 * k, device=DEV)
                    if seen == 'seen':
                        call(x)
                        sync()
                    with profile(activities=activities) as prof:
                        sync()
                        t = time.perf_counter()
                        call(x)
                        sync()
                        ms = (time.perf_counter() - t) * 1e3
                    events = prof.key_averages()
                    kernels = sum(e.count for e in events if e.device_type.name == 'CUDA')
                    aten = sum(e.count for e in events if e.key.startswith('aten::'))
                    out.write(f'\n===== {dtype} {name} {seen} size {tuple(x.shape[2:])}: '
                              f'{ms:.1f} ms wall, {kernels} kernel launches, {aten} aten calls\n')
                    out.write(events.table(sort_by='self_cpu_time_total', row_limit=22,
                                           max_name_column_width=48) + '\n')
                    if DEV.type == 'cuda':
                        out.write(events.table(sort_by='self_cuda_time_total', row_limit=12,
                                               max_name_column_width=48) + '\n')
                    out.flush()
                    log(f'profiled {dtype} {name} {seen}: {ms:.1f} ms, {kernels} kernels, '
                        f'{aten} aten calls')


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with open(os.path.join(OUT, 'log.txt'), 'w') as f:
        def log(*parts):
            line = ' '.join(str(p) for p in parts)
            print(line, flush=True)
            f.write(line + '\n')
            f.flush()

        import transformers
        log('device', torch.cuda.get_device_name() if DEV.type == 'cuda' else 'cpu (dry run)',
            'torch', torch.__version__, 'transformers', transformers.__version__)
        check_layout(log)
        bench = _load_benchmark()
        torch.manual_seed(0)
        ours = SwinTransformerV2(arch='tiny', window_size=16,
                                 pretrained_window_sizes=(16, 16, 16, 8)).eval()
        hf = bench.HFSwinv2Reference(ours).eval()  # gives ours HF's weights
        models = dict(ours_v2=ours.to(DEV), hf_v2=hf.to(DEV),
                      ours_swin=SwinTransformer().eval().to(DEV))
        time_sizes(bench, models, log)
        time_sizes(bench, models, log, 'train')
        v2 = {name: models[name] for name in ('ours_v2', 'hf_v2')}
        time_sizes(bench, v2, log, batch=2, scale=1.0, count=4)
        time_sizes(bench, v2, log, 'train', batch=2, scale=1.0, count=4)
        if DEV.type == 'cuda':
            count_syncs(bench, models, log)
        profiles(bench, models, log)
        log('done in', round(time.time() - START), 's')


if __name__ == '__main__':
    main()

"""Timing and peak memory of a case's variants on the workload users run: a new input size on
almost every call.

A *case* (an entry of ``presets/*.yaml``): ``model`` (:data:`MODELS`, or ``maskrcnn``), ``kind``
(``forward``, ``train``, ``whole``: the detector's train iteration), ``scale`` of the detection
recipe's sizes, ``count`` sizes per pass, ``batch``, optional ``backbone_kwargs`` and
``fused_adamw``, rows ``[label, subject, baseline, metric]`` (``time`` or ``peak``). A *variant*
is ``<impl> <dtype> [flags]``: impl ``ours``, ``ref`` (mmdet's Swin for Swin V1, HF's model for
Swin V2 and DINOv2), ``mmdet``, ``timm``, ``hf``; dtype ``fp32`` or autocast ``bf16``/``fp16``;
flags ``cp`` (with_cp), ``compiled`` (:func:`compile_blocks`), ``sep nhwc`` (Mask R-CNN with the
demo config's ``SeparableRoIAlign`` and ``ChannelsLastFCNMaskHead``). All variants get the same
inputs, interleaved call by call in alternating order; each size is fed twice, a first-seen and
a seen-again pass, reported apart (per-shape JIT and caches cost in the first).
"""
import argparse
import copy
import ctypes
import gc
import json
import os
import random
import re
import subprocess
import sys
import time
import traceback
from contextlib import nullcontext
from typing import List, Optional

import torch
import torch.nn as nn

from mmvitswin.core import BACKBONES

from .peers import BUILDERS, build_peer, family_of

MIB = 2**20
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}
# mmdet's Mask R-CNN Swin 3x recipe: RandomChoiceResize((1333, 480..800 step 32), keep_ratio)
SHORT_SIDES, LONG_MAX = tuple(range(480, 801, 32)), 1333
TINY = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8])
MODELS = {  # name -> our backbone (``frames``: video input (B, 3, T, H, W))
    'swin_t': dict(type='SwinTransformer'),
    'swin_tiny_test': dict(type='SwinTransformer', **TINY),
    'swinv2_t': dict(type='SwinTransformerV2', window_size=16,
                     pretrained_window_sizes=(16, 16, 16, 8)),
    'swinv2_tiny_test': dict(type='SwinTransformerV2', window_size=8, **TINY),
    'vit_adapter_simple_t': dict(type='ViTAdapter', arch='tiny', adapter='simple'),
    'vit_adapter_interaction_t': dict(type='ViTAdapter', arch='tiny', adapter='interaction'),
    'vit_adapter_dinov2_b_simple': dict(type='ViTAdapter', arch='dinov2-b', adapter='simple'),
    'vit_adapter_dinov2_b_interaction': dict(type='ViTAdapter', arch='dinov2-b',
                                             adapter='interaction'),
    'vit_adapter_dinov2_tiny_test': dict(
        type='ViTAdapter', arch=dict(embed_dims=64, num_layers=2, num_heads=2,
                                     feedforward_channels=256), patch_size=14, img_size=56,
        layer_scale_init_value=1e-5, final_norm=True, adapter='interaction', adapter_cfg=dict(
            num_heads=2, conv_inplane=16, n_points=2, interaction_indexes=[(0, 1), (1, 2)])),
    'hybrid_vit_t': dict(type='HybridViT', arch='tiny'),
    'swin3d_t': dict(type='SwinTransformer3D', arch='tiny', out_indices=(0, 1, 2, 3), frames=8),
}
MASK_RCNN = 'swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'  # under mmdet/.mim/configs


def draw_sizes(n: int, scale: float, seed: int) -> List[tuple]:
    """``n`` distinct (H, W): a short side from the recipe, an aspect ratio in [1, 1.8]
    (portrait one time in four), the long side capped, times ``scale``, padded up to 32."""
    rng, sizes = random.Random(seed), []
    for _ in range(100 * n + 1000):
        short = rng.choice(SHORT_SIDES)
        hw = [-(-round(s * scale) // 32) * 32
              for s in (short, min(short * rng.uniform(1, 1.8), LONG_MAX))]
        size = tuple(hw[::-1]) if rng.random() < 0.25 else tuple(hw)
        sizes += [] if size in sizes else [size]
        if len(sizes) == n:
            return sizes
    raise ValueError(f'cannot draw {n} distinct sizes at scale {scale}: raise the scale')


def det_batch(size, batch: int, num_classes: int, seed: int) -> dict:
    """uint8 images with three rectangular objects each (boxes, labels, masks)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    gen, (h, w) = torch.Generator().manual_seed(seed), size
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8))
        lo = torch.rand(3, 2, generator=gen) * 0.6
        boxes = (torch.cat([lo, (lo + 0.1 + torch.rand(3, 2, generator=gen) * 0.3).clamp(
            max=1)], 1) * torch.tensor([w, h, w, h])).floor()
        ys, xs = torch.arange(h)[None, :, None], torch.arange(w)[None, None, :]
        x1, y1, x2, y2 = boxes.long()[:, :, None, None].unbind(1)
        masks = ((xs >= x1) & (xs < x2) & (ys >= y1) & (ys < y2)).to(torch.uint8).numpy()
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w),
                                             scale_factor=(1.0, 1.0), pad_shape=(h, w)))
        sample.gt_instances = InstanceData(bboxes=boxes, masks=BitmapMasks(masks, h, w),
                                           labels=torch.randint(0, num_classes, (3, ),
                                                                generator=gen))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


# ------------------------------------------------------------------------------ memory
def sync(device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _status_kib(field: str) -> int:
    with open('/proc/self/status') as f:
        return int(re.search(rf'^{field}:\s+(\d+) kB', f.read(), re.MULTILINE).group(1))


def peak_bytes(fn, device) -> Optional[int]:
    """Peak memory increase during ``fn()``: on CUDA max_memory_allocated over the allocation
    before; on the CPU the resident high-water mark (VmHWM, reset by writing 5 to
    /proc/self/clear_refs; None where refused) over the RSS before."""
    gc.collect()
    try:  # hand glibc's free pages back, so RSS counts live memory
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass
    if device.type == 'cuda':
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - before
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return None
    before = _status_kib('VmRSS')
    fn()
    return max(0, max(_status_kib('VmHWM'), _status_kib('VmRSS')) - before) * 1024


# glibc: every block of 128 KiB or more mapped on its own and unmapped when freed. A process
# that has run other cases keeps freed blocks of up to 32 MiB resident and the high-water mark
# would count memory a call no longer holds, so CPU peaks are measured in a fresh process.
EXACT_HEAP = dict(MALLOC_MMAP_THRESHOLD_='131072', MALLOC_TRIM_THRESHOLD_='131072')


def peaks_in_child(case: dict, args, names: List[str], warmup, size) -> dict:
    """``{variant: bytes}``: each variant's peak of one call at ``size`` after a warm-up call
    at ``warmup``, in a fresh process of this tool started with :data:`EXACT_HEAP`."""
    spec = dict(case=case, args=vars(args), names=names, warmup=warmup, size=size,
                model=MODELS.get(case['model']))
    tool = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'benchmark.py')
    proc = subprocess.run([sys.executable, tool, '--peak-child'], input=json.dumps(spec),
                          capture_output=True, text=True, env=dict(os.environ, **EXACT_HEAP))
    if proc.returncode != 0:
        raise RuntimeError(f'peak measurement failed: {proc.stderr.strip()[-500:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peak_child() -> int:
    """The process :func:`peaks_in_child` starts: the spec on stdin, the peaks on stdout."""
    spec, device = json.load(sys.stdin), torch.device('cpu')
    args = argparse.Namespace(**spec['args'])
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    MODELS[spec['case']['model']] = spec['model']
    subject, peaks = Subject(spec['case'], args, device), {}
    for name in spec['names']:
        call = make_call(spec['case'], subject.variant(name), name, device)
        call(subject.make_input(spec['warmup'], 0))
        x = subject.make_input(spec['size'], 1)
        peaks[name] = peak_bytes(lambda: call(x), device)
    print(json.dumps(peaks))
    return 0


# ------------------------------------------------------------------------------ models
def compile_blocks(model: nn.Module) -> int:
    """Regional compilation: ``torch.compile(dynamic=True)`` each module of every innermost
    repeated run of blocks (an ``nn.ModuleList`` of two or more modules of one class: a Swin
    stage's blocks), in place; the rest stays eager. Blocks of one class share a graph, so a
    model compiles in minutes, and dynamic shapes spare a recompilation per size."""
    def runs(module):
        return [m for m in module.children() if isinstance(m, nn.ModuleList) and len(m) > 1
                and len({type(b) for b in m}) == 1]

    from torch._dynamo import config
    for attr in ('recompile_limit', 'cache_size_limit'):  # one entry per width, shift, dtype
        if hasattr(config, attr):
            setattr(config, attr, max(getattr(config, attr), 512))
    count = 0
    for blocks in [r for m in model.modules() for r in runs(m)]:
        if not any(runs(m) for b in blocks for m in b.modules()):
            for i, block in enumerate(blocks):
                blocks[i], count = torch.compile(block, dynamic=True), count + 1
    return count


def build_ours(cfg: dict) -> nn.Module:
    """Our backbone (the plain class of ``mmvitswin.core``) from a config dict."""
    cfg = dict(cfg)
    return BACKBONES[str(cfg.pop('type')).split('.')[-1]](**cfg)


class Subject:
    """A case's model and reference; builds its variants (each its own copy, so per-shape caches
    start cold) and the input for a size."""

    def __init__(self, case: dict, args, device):
        self.case, self.args, self.device = case, args, device
        torch.manual_seed(args.seed)
        if case['kind'] == 'whole':
            import mmvitswin  # noqa: F401  (registers ours, bridged into mmdet's registry)
            from mmdet.registry import MODELS as DETECTORS
            from mmengine.config import Config
            from mmengine.registry import DefaultScope
            cfg = Config.fromfile(os.path.join(os.path.dirname(__import__('mmdet').__file__),
                                               '.mim', 'configs', MASK_RCNN)).model
            cfg.backbone.update(init_cfg=None, drop_path_rate=0.0,
                                **case.get('backbone_kwargs', {}))
            with DefaultScope.overwrite_default_scope('mmdet'):
                self.base = DETECTORS.build(cfg)
            self.base.init_weights()
            self.num_classes, self.ref = cfg.roi_head.bbox_head.num_classes, 'mmdet'
            return
        self.cfg = dict(copy.deepcopy(MODELS[case['model']]), **case.get('backbone_kwargs', {}))
        self.frames = self.cfg.pop('frames', None)
        self.base = build_ours(self.cfg)
        family = family_of(self.base)
        self.ref = args.reference if family == 'swin' else 'hf'
        self.ref = self.ref if (family, self.ref) in BUILDERS else None

    def variant(self, name: str) -> nn.Module:
        impl, _, *flags = name.split()
        impl = self.ref if impl == 'ref' else impl
        if impl is None:
            raise LookupError(f'{name}: this case has no reference')
        if self.case['kind'] == 'whole':
            model = copy.deepcopy(self.base)
            if impl != 'ours':
                model.backbone = build_peer(impl, model.backbone)
            if 'sep' in flags:  # the demo config's RoI layers and mask head
                swap_detector_layers(model)
        elif impl == 'ours' and 'cp' in flags:
            model = build_ours(dict(self.cfg, with_cp=True))
            model.load_state_dict(self.base.state_dict())
        else:
            model = copy.deepcopy(self.base) if impl == 'ours' else \
                build_peer(impl, self.base, with_cp='cp' in flags)
        model.to(self.device)
        model.train(self.case['kind'] != 'forward')  # (mmdet's Swin.train() returns None)
        if 'compiled' in flags or self.args.compile:
            compile_blocks(model)
        return model

    def make_input(self, size, index: int):
        batch, seed = self.case.get('batch', 1), self.args.seed * 100003 + index
        if self.case['kind'] == 'whole':
            return det_batch(size, batch, self.num_classes, seed)
        shape = (batch, 3) + ((self.frames, ) if self.frames else ()) + tuple(size)
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(self.device)


def swap_detector_layers(model: nn.Module) -> int:
    """Each mmcv ``RoIAlign`` (avg) -> ``SeparableRoIAlign`` of the same settings, each stock
    ``FCNMaskHead`` -> ``ChannelsLastFCNMaskHead`` (same parameters); returns how many."""
    from mmcv.ops import RoIAlign
    from mmdet.models.roi_heads.mask_heads import FCNMaskHead

    from mmvitswin.core.ops import SeparableRoIAlign
    from mmvitswin.openmmlab.models import ChannelsLastFCNMaskHead
    swapped = 0
    for module in list(model.modules()):
        if type(module) is FCNMaskHead:
            module.__class__, swapped = ChannelsLastFCNMaskHead, swapped + 1
        for name, m in list(module.named_children()):
            if isinstance(m, RoIAlign) and m.pool_mode == 'avg':
                setattr(module, name, SeparableRoIAlign(m.output_size, m.spatial_scale,
                                                        m.sampling_ratio, aligned=m.aligned))
                swapped += 1
    return swapped


def make_call(case: dict, model: nn.Module, name: str, device):
    """The timed work of variant ``name``: ``call(input)``. A train step is a training run's:
    autocast forward (loss: the outputs' mean squares), backward, AdamW (fused where the case
    asks, as our Swin V2 configs and HF's Trainer), a loss scale in fp16. A detector runs its
    ``train_step`` through the optim wrapper ``tools/train.py --amp`` builds."""
    dtype, kind = name.split()[1], case['kind']

    def amp():
        return torch.autocast(device.type, DTYPES[dtype]) if dtype != 'fp32' else nullcontext()
    if kind == 'forward':
        def forward(x):
            with torch.no_grad(), amp():
                return model(x)
        return forward
    if kind == 'whole':
        from mmvitswin.openmmlab.engine.amp import apply_amp
        from mmvitswin.openmmlab.engine.grouped import GroupedOptimWrapperConstructor
        cfg = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05))
        if dtype != 'fp32':
            apply_amp(cfg, device.type == 'cuda', dtype)
        wrapper = GroupedOptimWrapperConstructor(cfg)(model)
        return lambda batch: model.train_step(copy.deepcopy(batch), wrapper)
    params = [p for p in model.parameters() if p.requires_grad]
    try:  # the fused kernel where this torch has one for the device
        optim = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05,
                                  fused=bool(case.get('fused_adamw')) or None)
    except RuntimeError:
        optim = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05)
    scaler = (torch.amp.GradScaler('cuda', enabled=dtype == 'fp16') if hasattr(  # torch >= 2.3
        torch.amp, 'GradScaler') else torch.cuda.amp.GradScaler(enabled=dtype == 'fp16'))

    def step(x):
        with amp():
            out = model(x)
            loss = sum(o.float().square().mean() for o in ([out] if torch.is_tensor(out) else out))
        scaler.scale(loss).backward()
        scaler.step(optim)
        scaler.update()
        optim.zero_grad(set_to_none=True)
    return step


# ------------------------------------------------------------------------------ a case
def case_rows(case: dict, args) -> List[dict]:
    """The rows ``--only``/``--skip`` keep, 'bf16' read as ``--dtype``; a time row against
    'ref <dtype>' also gets the peers in that precision."""
    rows = []
    for label, subject, baseline, metric in case['rows']:
        label, subject, baseline = (n and n.replace('bf16', args.dtype)
                                    for n in (label, subject, baseline))
        if (args.only and not any(s in label for s in args.only)) or \
                any(s in label for s in args.skip or ()):
            continue
        ref = re.fullmatch(r'ref (\w+)', baseline or '')
        rows.append(dict(label=label + ' [compiled]' * args.compile, subject=subject,
                         baseline=baseline, metric=metric, peers=[
                             f'{p} {ref.group(1)}' for p in args.peers
                             if ref and metric == 'time' and case['kind'] != 'whole']))
    return rows


def run_case(case: dict, args, device) -> dict:
    rows = case_rows(case, args)
    if not rows:
        return dict(case=case, rows=[])
    count = args.count if args.count is not None and case['count'] else case['count']
    sizes = draw_sizes(count + 1, case['scale'], args.seed)
    subject = Subject(case, args, device)
    for r in rows:  # peers that are the reference, or lack this model, are left out
        r['reference'] = subject.ref
        r['peers'] = [p for p in r['peers'] if p.split()[0] != subject.ref
                      and (family_of(subject.base), p.split()[0]) in BUILDERS]
    names = list(dict.fromkeys(n for r in rows for n in (r['subject'], r['baseline'],
                                                         *r['peers']) if n))
    calls, variants = {}, {n: dict(first=[], again=[]) for n in names}
    for name in names:
        try:
            calls[name] = make_call(case, subject.variant(name), name, device)
        except Exception as exc:  # noqa: BLE001  (a peer missing, or without this model)
            variants[name]['error'] = f'not built: {type(exc).__name__}: {exc}'.splitlines()[0]
            print(f'[bench] {name} {variants[name]["error"]}', file=sys.stderr, flush=True)
    record = dict(case=case, sizes=sizes, variants=variants)
    if args.dry_run:
        return dict(record, rows=[dict(r, dry_run=True) for r in rows])

    def run(name, fn):
        """fn() for a variant that has not failed; a failure is recorded, the others go on."""
        if name in calls and 'error' not in variants[name]:
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001  (e.g. a peer refusing a size)
                traceback.print_exc()
                variants[name]['error'] = f'{type(exc).__name__}: {exc}'.splitlines()[0][:200]

    def timed(name, x):
        sync(device)
        start = time.perf_counter()
        calls[name](x)
        sync(device)
        return time.perf_counter() - start

    for name in calls:  # warm-up at a size no pass uses
        run(name, lambda: timed(name, subject.make_input(sizes[0], 0)))
    for phase in ('first', 'again'):
        for i, size in enumerate(sizes[1:], 1):
            x = subject.make_input(size, i)
            for name in (list(calls) if i % 2 else list(calls)[::-1]):
                t = run(name, lambda: timed(name, x))
                variants[name][phase] += [] if t is None else [t]
    peak_names = list(dict.fromkeys(n for r in rows if r['metric'] == 'peak'
                                    for n in (r['subject'], r['baseline']) if n in calls))
    if peak_names:
        big = max(sizes, key=lambda s: s[0] * s[1])
        if device.type == 'cpu':
            try:
                peaks = peaks_in_child(case, args, peak_names, sizes[0], big)
            except RuntimeError as exc:  # the times stand; the peak rows show '-'
                peaks = {}
                print(exc, file=sys.stderr)
        else:
            x = subject.make_input(big, 1)
            peaks = {n: run(n, lambda: peak_bytes(lambda: calls[n](x), device))
                     for n in peak_names}
        for name in peak_names:
            variants[name]['peak_bytes'] = peaks.get(name)
    return dict(record, rows=[dict(r, **summarize_row(r, variants)) for r in rows])


def _mean_ms(times) -> Optional[float]:
    return 1e3 * sum(times) / len(times) if times else None


def summarize_row(row: dict, variants: dict) -> dict:
    """Time rows: ``{phase}_ms`` of subject and baseline, ``{phase}_speedup`` = baseline /
    subject, each peer's ``{impl}_{phase}_ms`` and ``fastest_{phase}_speedup`` (the fastest of
    baseline and peers / subject: > 1, the subject beats every one). Peak rows: MiB and
    subject / baseline."""
    s, b = variants[row['subject']], variants.get(row['baseline']) or {}
    if 'error' in s:
        return dict(error=s['error'])
    out = dict(baseline_error=b['error']) if 'error' in b else {}
    if row['metric'] == 'peak':
        ps, pb = s.get('peak_bytes'), b.get('peak_bytes')
        return dict(out, peak_mib=ps and ps / MIB, peak_mib_baseline=pb and pb / MIB,
                    peak_ratio=ps / pb if ps and pb else None)
    for phase in ('first', 'again'):
        mine, base = _mean_ms(s[phase]), _mean_ms(b.get(phase))
        others = [base] + [_mean_ms(variants[n].get(phase)) for n in row['peers']]
        out.update({f'{n.split()[0]}_{phase}_ms': ms for n, ms in zip(row['peers'], others[1:])})
        out.update({f'{phase}_ms': mine, f'{phase}_ms_baseline': base,
                    f'{phase}_speedup': base / mine if base and mine else None,
                    f'fastest_{phase}_speedup': min(o for o in others if o) / mine
                    if mine and any(others) else None})
    return out

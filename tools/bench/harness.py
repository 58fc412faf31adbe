"""Timing and peak memory of a case's variants on the workload users run: a new input size on
almost every call.

A *case* (``presets/*.yaml``): ``model`` (``models.yaml``, or ``maskrcnn``), ``kind``
(``forward``, ``train``, ``whole``: the detector's train iteration), ``scale`` of the recipe's
sizes, ``count`` sizes per pass, ``batch``, optional ``backbone_kwargs`` and ``fused_adamw``,
``rows`` of ``[label, subject, baseline, time|peak]``. A *variant* is ``<impl> <dtype> [flags]``:
impl ``ours``, ``ref`` (mmdet's Swin V1, HF's Swin V2 and DINOv2), ``mmdet``, ``timm``, ``hf``;
dtype ``fp32`` or autocast ``bf16``/``fp16``; flags ``cp`` (with_cp), ``compiled`` (each block
under ``torch.compile``), ``sep nhwc`` (the demo config's RoI layers and mask head). All
variants get the same inputs, call by call in alternating order, over a pass of new sizes and a
pass of the same sizes again (per-shape JIT and caches cost in the first).
"""
import copy
import os
import random
import re
import sys
import time
import traceback
from contextlib import nullcontext
from typing import List, Optional

import torch
import torch.nn as nn
import yaml
from torch.profiler import ProfilerActivity, profile

from mmvitswin.core import BACKBONES

from .peers import PEERS, build_peer, family_of, has_peer

DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}
# mmdet's Mask R-CNN Swin 3x recipe: RandomChoiceResize((1333, 480..800 step 32), keep_ratio)
SHORT_SIDES, LONG_MAX = tuple(range(480, 801, 32)), 1333
with open(os.path.join(os.path.dirname(__file__), 'models.yaml')) as f:
    MODELS = yaml.safe_load(f)  # name -> our backbone's arguments
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


def build_ours(cfg: dict) -> nn.Module:
    """Our backbone (the plain class of ``mmvitswin.core``) from a config dict."""
    cfg = dict(cfg)
    return BACKBONES[str(cfg.pop('type')).split('.')[-1]](**cfg)


def build_mask_rcnn(backbone_kwargs: dict) -> nn.Module:
    """mmdet's Mask R-CNN Swin-T (:data:`MASK_RCNN`) with our backbone, no pretrained file."""
    import mmvitswin  # noqa: F401  (registers ours, bridged into mmdet's registry)
    from mmdet.registry import MODELS as DETECTORS
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    cfg = Config.fromfile(os.path.join(os.path.dirname(__import__('mmdet').__file__), '.mim',
                                       'configs', MASK_RCNN)).model
    cfg.backbone.update(init_cfg=None, drop_path_rate=0.0, **backbone_kwargs)
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = DETECTORS.build(cfg)
    model.init_weights()
    return model


def swap_detector_layers(model: nn.Module) -> None:
    """Each mmcv ``RoIAlign`` (avg) -> ``SeparableRoIAlign`` of the same settings, each stock
    ``FCNMaskHead`` -> ``ChannelsLastFCNMaskHead`` (same parameters)."""
    from mmcv.ops import RoIAlign
    from mmdet.models.roi_heads.mask_heads import FCNMaskHead

    from mmvitswin.core.ops import SeparableRoIAlign
    from mmvitswin.openmmlab.models import ChannelsLastFCNMaskHead
    for module in list(model.modules()):
        if type(module) is FCNMaskHead:
            module.__class__ = ChannelsLastFCNMaskHead
        for name, m in list(module.named_children()):
            if isinstance(m, RoIAlign) and m.pool_mode == 'avg':
                setattr(module, name, SeparableRoIAlign(m.output_size, m.spatial_scale,
                                                        m.sampling_ratio, aligned=m.aligned))


class Subject:
    """A case's model and reference: builds its variants (each its own copy, so per-shape caches
    start cold), their calls, and the input for a size."""

    def __init__(self, case: dict, device, seed: int = 0):
        self.case, self.device, self.seed, self.whole = case, device, seed, case['kind'] == 'whole'
        torch.manual_seed(seed)
        self.cfg = dict(copy.deepcopy(MODELS.get(case['model'], {})),
                        **case.get('backbone_kwargs', {}))
        self.frames = self.cfg.pop('frames', None)
        self.base = build_mask_rcnn(self.cfg) if self.whole else build_ours(self.cfg)
        family = family_of(self.base.backbone if self.whole else self.base)
        self.ref = 'mmdet' if family == 'swin' else 'hf' if family else None

    def variant(self, name: str) -> nn.Module:
        impl, _, *flags = name.split()
        if self.whole:
            model = copy.deepcopy(self.base)
            if impl != 'ours':
                model.backbone = build_peer(impl, model.backbone)
            if 'sep' in flags:
                swap_detector_layers(model)
        elif impl == 'ours' and 'cp' in flags:
            model = build_ours(dict(self.cfg, with_cp=True))
            model.load_state_dict(self.base.state_dict())
        else:
            model = copy.deepcopy(self.base) if impl == 'ours' else build_peer(impl, self.base)
        model.to(self.device).train(self.case['kind'] != 'forward')
        if 'compiled' in flags:  # regional: the blocks of a stage share one dynamic graph
            import torch._dynamo
            torch._dynamo.config.cache_size_limit = 512  # an entry per width, shift, dtype
            for path, blocks in model.named_modules():
                if path.endswith('blocks') and isinstance(blocks, nn.ModuleList):
                    for i, block in enumerate(blocks):
                        blocks[i] = torch.compile(block, dynamic=True)
        return model

    def call(self, name: str):
        """Variant ``name``'s timed work, ``call(input)``. A train step: autocast forward, loss
        (the outputs' mean squares), backward, AdamW (fused where the case asks, as our Swin V2
        configs and HF's Trainer), a loss scale in fp16; a detector's ``train_step`` with the
        optim wrapper ``tools/train.py --amp`` builds."""
        model, dtype, device = self.variant(name), name.split()[1], self.device

        def amp():
            return torch.autocast(device.type, DTYPES[dtype]) if dtype != 'fp32' else nullcontext()
        if self.case['kind'] == 'forward':
            def forward(x):
                with torch.no_grad(), amp():
                    return model(x)
            return forward
        if self.whole:
            from mmvitswin.openmmlab.engine.amp import apply_amp
            from mmvitswin.openmmlab.engine.grouped import GroupedOptimWrapperConstructor
            cfg = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4,
                                                           weight_decay=0.05))
            if dtype != 'fp32':
                apply_amp(cfg, device.type == 'cuda', dtype)
            wrapper = GroupedOptimWrapperConstructor(cfg)(model)
            return lambda batch: model.train_step(copy.deepcopy(batch), wrapper)
        params = [p for p in model.parameters() if p.requires_grad]
        try:  # the fused kernel where this torch has one for the device
            optim = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05,
                                      fused=bool(self.case.get('fused_adamw')) or None)
        except RuntimeError:
            optim = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05)
        scaler = getattr(torch.amp, 'GradScaler', torch.cuda.amp.GradScaler)(  # torch < 2.3
            enabled=dtype == 'fp16')

        def step(x):
            with amp():
                out = model(x)
                loss = sum(o.float().square().mean() for o in (
                    [out] if torch.is_tensor(out) else out))
            scaler.scale(loss).backward()
            scaler.step(optim)
            scaler.update()
            optim.zero_grad(set_to_none=True)
        return step

    def make_input(self, size, index: int):
        batch, seed = self.case.get('batch', 1), self.seed * 100003 + index
        if self.whole:  # mmdet's demo batch: uint8 images, three random boxes, labels, masks
            from mmdet.testing import demo_mm_inputs
            return demo_mm_inputs(batch, [(3, *size)] * batch, num_items=[3] * batch,
                                  num_classes=self.base.roi_head.bbox_head.num_classes,
                                  with_mask=True)
        shape = (batch, 3) + ((self.frames, ) if self.frames else ()) + tuple(size)
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(self.device)


# ------------------------------------------------------------------------------ memory
def sync(device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def peak_bytes(fn, device) -> int:
    """The peak of the tensor memory ``fn()`` allocates over what was held before: on CUDA the
    rise of max_memory_allocated; on the CPU, where torch keeps no allocator statistics, the
    running sum of the profiler's allocation events in time order."""
    if device.type == 'cuda':
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    now = peak = 0
    for _, nbytes in sorted(  # start_us: torch < 2.4
            (e.start_ns() if hasattr(e, 'start_ns') else 1e3 * e.start_us(), e.nbytes())
            for e in prof.profiler.kineto_results.events()
            if e.name() == '[memory]' and e.device_type().name == 'CPU'):
        now += nbytes
        peak = max(peak, now)
    return peak


# ------------------------------------------------------------------------------ a case
def case_rows(case: dict, args) -> List[dict]:
    """The rows ``--only``/``--skip`` keep, 'bf16' read as ``--dtype``."""
    rows = [dict(zip(('label', 'subject', 'baseline', 'metric'),
                     [n and n.replace('bf16', args.dtype) for n in row])) for row in case['rows']]
    return [r for r in rows if (not args.only or any(s in r['label'] for s in args.only))
            and not any(s in r['label'] for s in args.skip or ())]


def error_text(exc: Exception) -> str:
    return f'{type(exc).__name__}: {exc}'.splitlines()[0][:200]


def run_case(case: dict, args, device, dry_run: bool = False, probe=None) -> dict:
    """Builds the variants the kept rows name, times them (a failure is recorded, the others go
    on), measures the peak rows; ``dry_run``: builds only. ``probe(variant's record, device)``:
    a context around each call of the new-sizes pass (``--profile``), then the only pass."""
    rows = case_rows(case, args)
    if not rows:
        return dict(case=case, rows=[])
    count = args.count if args.count and case['count'] else case['count']
    sizes = draw_sizes(count + 1, case['scale'], args.seed)
    subject = Subject(case, device, args.seed)
    for r in rows:  # 'ref': the reference; a time row against it gets the peers in its dtype
        ref = re.fullmatch(r'ref (\w+)', r['baseline'] or '')
        r.update({k: r[k] and re.sub(r'\bref\b', subject.ref or 'ref', r[k]) for k in (
            'label', 'subject', 'baseline')}, reference=subject.ref, peers=[
            f'{p} {ref.group(1)}' for p in PEERS if ref and r['metric'] == 'time'
            and p != subject.ref and has_peer(subject.base, p)])
    names = list(dict.fromkeys(n for r in rows for n in (r['subject'], r['baseline'],
                                                         *r['peers']) if n))
    calls, variants = {}, {n: dict(first=[], again=[]) for n in names}
    for name in names:
        try:
            calls[name] = subject.call(name)
        except Exception as exc:  # noqa: BLE001  (a peer missing, or without this model)
            variants[name]['error'] = 'not built: ' + error_text(exc)
            print(f'[bench] {name} {variants[name]["error"]}', file=sys.stderr, flush=True)
    record = dict(case=case, sizes=sizes, variants=variants)
    if dry_run:
        return dict(record, rows=[dict(r, dry_run=True) for r in rows])

    def timed(name, x, probe=None):
        """Seconds of one call; None once the variant has failed (e.g. refusing a size)."""
        if name in calls and 'error' not in variants[name]:
            try:
                with probe(variants[name], device) if probe else nullcontext():
                    sync(device)
                    start = time.perf_counter()
                    calls[name](x)
                    sync(device)
                    return time.perf_counter() - start
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                variants[name]['error'] = error_text(exc)

    for name in calls:  # warm-up at a size no pass uses
        timed(name, subject.make_input(sizes[0], 0))
    for phase in ('first', ) if probe else ('first', 'again'):
        for i, size in enumerate(sizes[1:], 1):
            x = subject.make_input(size, i)
            for name in (list(calls) if i % 2 else list(calls)[::-1]):
                t = timed(name, x, probe)
                variants[name][phase] += [] if t is None else [t]
    peak_names = dict.fromkeys(n for r in rows if r['metric'] == 'peak' for n in (
        r['subject'], r['baseline']) if n in calls and 'error' not in variants[n])
    x = subject.make_input(max(sizes, key=lambda s: s[0] * s[1]), 1)  # the largest size
    for name in peak_names:
        try:
            variants[name]['peak_bytes'] = peak_bytes(lambda: calls[name](x), device)
        except Exception as exc:  # noqa: BLE001
            variants[name]['error'] = error_text(exc)
    return dict(record, rows=[dict(r, **summarize_row(r, variants)) for r in rows])


def summarize_row(row: dict, variants: dict) -> dict:
    """Time rows: ``{phase}_ms`` of subject and baseline, ``{phase}_speedup`` = baseline /
    subject, each peer's ``{impl}_{phase}_ms`` and ``fastest_{phase}_speedup`` (the fastest of
    baseline and peers / subject: > 1, the subject beats every one). Peak rows: MiB and
    subject / baseline."""
    def mean_ms(times) -> Optional[float]:
        return 1e3 * sum(times) / len(times) if times else None
    s, b = variants[row['subject']], variants.get(row['baseline']) or {}
    if 'error' in s:
        return dict(error=s['error'])
    out = dict(baseline_error=b['error']) if 'error' in b else {}
    if row['metric'] == 'peak':
        ps, pb = s.get('peak_bytes'), b.get('peak_bytes')
        return dict(out, peak_mib=ps and ps / 2**20, peak_mib_baseline=pb and pb / 2**20,
                    peak_ratio=ps / pb if ps and pb else None)
    for phase in ('first', 'again'):
        mine, base = mean_ms(s[phase]), mean_ms(b.get(phase))
        others = [base] + [mean_ms(variants[n].get(phase)) for n in row['peers']]
        out.update({f'{n.split()[0]}_{phase}_ms': ms for n, ms in zip(row['peers'], others[1:])})
        out.update({f'{phase}_ms': mine, f'{phase}_ms_baseline': base,
                    f'{phase}_speedup': base / mine if base and mine else None,
                    f'fastest_{phase}_speedup': min(o for o in others if o) / mine
                    if mine and any(others) else None})
    return out

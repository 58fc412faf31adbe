#!/usr/bin/env python
"""Speed and memory of mmvitswin's backbones and whole models against mmdet's/mmseg's own, on
the workload users run: a new input size on almost every call.

A *case* builds a few *variants* of one model -- ours or the reference (the host's own Swin with
our weights), fp32 or autocast to bf16/fp16, with_cp, torch.compile -- and feeds them the same
inputs, interleaved call by call (the order alternates, so a load change hits all alike). Sizes
are drawn like mmdet's multi-scale resize in the Mask R-CNN Swin 3x recipe (short side 480-800
in steps of 32, long side <= 1333, aspect kept), scaled by the case's ``scale`` and padded to a
multiple of 32, seeded. Each size is fed twice: a first-seen pass and a seen-again pass, reported
apart (per-shape JIT and caches cost in the first). A *row* compares two variants:

- time: mean ms per call of the subject and the baseline, speed-up = baseline / subject;
- peak: peak memory increase of one call at the largest size, ratio = subject / baseline;
- rss: resident memory growth of each variant over ``count`` new sizes (run one after the
  other, reference first), MiB and the difference.

A row without a baseline (no reference for that backbone) is timed alone; its ratio is '-'.
Presets are data (``PRESETS``); ``--cases FILE`` (JSON or YAML, the same schema) runs others.

    python tools/benchmark.py --preset standard --out-dir bench_out      # `make bench`
    python tools/benchmark.py --preset quick --out-dir /tmp/bq            # about a minute
    python tools/benchmark.py --preset rss                                # 300 new sizes
    python tools/benchmark.py --device cuda --dtype bf16 --compile
    python tools/benchmark.py --backbone ViTAdapter --backbone-kwargs '{"arch": "small"}'

Outputs in ``--out-dir``: ``benchmark.json`` (machine, settings, sizes, every raw time) and
``benchmark.md`` (the tables, also printed).
"""
import argparse
import copy
import ctypes
import ctypes.util
import gc
import inspect
import json
import os
import platform
import random
import re
import subprocess
import sys
import time
import traceback
from typing import List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from mmvitswin.core import compat  # noqa: E402  (torch-version differences: autocast)

MIB = 2**20
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}
# mmdet's Mask R-CNN Swin 3x recipe: RandomChoiceResize((1333, 480..800 step 32), keep_ratio)
SHORT_SIDES, LONG_MAX = tuple(range(480, 801, 32)), 1333
WHOLE = {  # alias -> (host, config under <host>/.mim/configs)
    'maskrcnn': ('mmdet', 'swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'),
    'upernet': ('mmseg',
                'swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'),
}
BACKBONES = {  # name -> our backbone config (frames: video input (B, 3, T, H, W))
    'swin_t': dict(type='SwinTransformer'),  # mmdet's defaults are Swin-T
    'swin_tiny_test': dict(type='SwinTransformer', embed_dims=32, depths=[1, 1, 1, 1],
                           num_heads=[1, 2, 4, 8]),
    'vit_adapter_simple_t': dict(type='ViTAdapter', arch='tiny', adapter='simple'),
    'vit_adapter_interaction_t': dict(type='ViTAdapter', arch='tiny', adapter='interaction'),
    'hybrid_vit_t': dict(type='HybridViT', arch='tiny'),
    'swin3d_t': dict(type='SwinTransformer3D', arch='tiny', out_indices=(0, 1, 2, 3),
                     frames=8),
}
# A case: kind (forward | train | whole | rss | rss_train), model (a BACKBONES or WHOLE key),
# scale (of the recipe's sizes) or sides (low, high: H and W drawn independently), count (sizes
# per pass), batch, rows: [label, subject, baseline, metric], optional backbone_kwargs (merged
# into the backbone config).
# A variant is 'ours'|'ref' + dtype, then optional flags: ' cp' (with_cp=True), ' compiled'
# (compile_blocks), ' sep' (whole detectors: RoI layers -> SeparableRoIAlign), ' nhwc' (whole
# detectors: FCNMaskHead -> ChannelsLastFCNMaskHead); 'bf16' follows --dtype. --compile adds
# ' compiled' to every variant.
_SWIN = dict(model='swin_t', scale=0.4, batch=1)


def _swin_speed_rows(kind: str, suffix: str = '') -> list:
    """The fp32 and bf16 time rows of a Swin-T forward or train-step case."""
    what = 'forward' if kind == 'forward' else 'train step'
    amp = '' if kind == 'forward' else ' AMP'
    return [[f'Swin-T {what} fp32{suffix}', 'ours fp32', 'ref fp32', 'time'],
            [f'Swin-T {what} bf16{amp} vs ref fp32{suffix}', 'ours bf16', 'ref fp32', 'time'],
            [f'Swin-T {what} bf16{amp} vs ref bf16{suffix}', 'ours bf16', 'ref bf16', 'time']]


PRESETS = {
    'standard': [
        dict(_SWIN, kind='forward', count=12, rows=_swin_speed_rows('forward')),
        dict(_SWIN, kind='train', count=6, rows=_swin_speed_rows('train') + [
            ['Swin-T train step peak memory, bf16 AMP vs ref fp32', 'ours bf16', 'ref fp32',
             'peak']]),
        # the detection recipe's own sizes (short side 480-800, long side up to 1344)
        dict(_SWIN, kind='forward', scale=1.0, count=4,
             rows=_swin_speed_rows('forward', ', recipe sizes') + [
                 ['Swin-T forward fp32 compiled vs ref fp32, recipe sizes', 'ours fp32 compiled',
                  'ref fp32', 'time'],
                 ['Swin-T forward bf16 compiled vs ref fp32, recipe sizes', 'ours bf16 compiled',
                  'ref fp32', 'time'],
                 ['Swin-T forward bf16 compiled vs ours bf16 eager, recipe sizes',
                  'ours bf16 compiled', 'ours bf16', 'time']]),
        dict(_SWIN, kind='train', scale=1.0, count=3,
             rows=_swin_speed_rows('train', ', recipe sizes') + [
                 ['Swin-T train step peak memory, bf16 AMP vs ref fp32, recipe sizes',
                  'ours bf16', 'ref fp32', 'peak']]),
        dict(_SWIN, kind='train', count=0, rows=[
            ['Swin-T train step peak memory, with_cp=True vs without (fp32)', 'ours fp32 cp',
             'ours fp32', 'peak']]),
        dict(_SWIN, kind='train', scale=1.0, count=0, rows=[
            ['Swin-T train step peak memory, with_cp=True vs without (fp32), recipe sizes',
             'ours fp32 cp', 'ours fp32', 'peak']]),
        dict(model='maskrcnn', kind='whole', scale=0.5, count=4, batch=1, rows=[
            ['Mask R-CNN Swin-T train iteration, --amp bf16 vs ref fp32', 'ours bf16',
             'ref fp32', 'time'],
            ['Mask R-CNN Swin-T train iteration, --amp bf16 + SeparableRoIAlign + '
             'ChannelsLastFCNMaskHead vs ref fp32', 'ours bf16 sep nhwc', 'ref fp32', 'time']]),
        dict(model='vit_adapter_simple_t', kind='forward', scale=0.4, count=3, batch=1, rows=[
            ['ViTAdapter-T simple forward fp32', 'ours fp32', None, 'time']]),
        dict(model='vit_adapter_interaction_t', kind='forward', scale=0.4, count=3, batch=1,
             rows=[['ViTAdapter-T interaction forward fp32', 'ours fp32', None, 'time']]),
        dict(model='hybrid_vit_t', kind='forward', scale=0.4, count=3, batch=1, rows=[
            ['HybridViT-T forward fp32', 'ours fp32', None, 'time']]),
        dict(model='swin3d_t', kind='forward', scale=0.2, count=2, batch=1, rows=[
            ['SwinTransformer3D-T forward fp32, 8 frames', 'ours fp32', None, 'time']]),
    ],
    'rss': [dict(model='swin_t', kind='rss', scale=1.0, count=300, batch=1, rows=[
        ['Swin-T resident memory growth after {count} new sizes, forward fp32', 'ours fp32',
         'ref fp32', 'rss']]),
            dict(model='swin_t', kind='rss_train', sides=(160, 800), count=300, batch=1, rows=[
                ['Swin-T resident memory growth after {count} new sizes, train step fp32',
                 'ours fp32', 'ref fp32', 'rss']])],
    'quick': [  # every code path on a tiny Swin, about a minute on 2 cores
        dict(model='swin_tiny_test', kind='forward', scale=0.2, count=2, batch=1, rows=[
            ['tiny forward fp32', 'ours fp32', 'ref fp32', 'time'],
            ['tiny forward bf16 vs ref bf16', 'ours bf16', 'ref bf16', 'time']]),
        dict(model='swin_tiny_test', kind='train', scale=0.2, count=2, batch=1, rows=[
            ['tiny train step bf16 AMP vs ref fp32', 'ours bf16', 'ref fp32', 'time'],
            ['tiny train step peak memory, with_cp=True vs without', 'ours fp32 cp',
             'ours fp32', 'peak']]),
        dict(model='swin_tiny_test', kind='rss', scale=0.2, count=8, batch=1, rows=[
            ['tiny resident memory growth, {count} new sizes', 'ours fp32', 'ref fp32',
             'rss']]),
        dict(model='hybrid_vit_t', kind='forward', scale=0.15, count=1, batch=1, rows=[
            ['HybridViT-T forward fp32', 'ours fp32', None, 'time']]),
    ],
}


# ------------------------------------------------------------------------------ sizes, input
def draw_sizes(n: int, scale: float, seed: int) -> List[Tuple[int, int]]:
    """``n`` distinct (H, W): a short side from the recipe, an aspect ratio in [1, 1.8]
    (portrait one time in four), the long side capped, times ``scale``, padded up to 32."""
    rng, sizes, tries = random.Random(seed), [], 0
    while len(sizes) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise ValueError(f'cannot draw {n} distinct sizes at scale {scale}: the recipe has '
                             'fewer distinct padded sizes there (about 190 at 0.6); raise it')
        short = rng.choice(SHORT_SIDES)
        long = min(short * rng.uniform(1.0, 1.8), LONG_MAX)
        hw = [-(-int(round(s * scale)) // 32) * 32 for s in (short, long)]
        size = tuple(hw[::-1]) if rng.random() < 0.25 else tuple(hw)
        if size not in sizes:
            sizes.append(size)
    return sizes


def draw_grid_sizes(n: int, low: int, high: int, seed: int) -> List[Tuple[int, int]]:
    """``n`` distinct (H, W), each side a multiple of 32 drawn uniformly from [low, high]: many
    more distinct sizes than the recipe has at a small scale, for the long memory cases."""
    sides = list(range(-(-low // 32) * 32, high + 1, 32))
    if n > len(sides)**2:
        raise ValueError(f'cannot draw {n} distinct sizes from sides {low}-{high}: only '
                         f'{len(sides)**2} exist')
    rng, sizes = random.Random(seed), set()
    ordered = []
    while len(ordered) < n:
        size = (rng.choice(sides), rng.choice(sides))
        if size not in sizes:
            sizes.add(size)
            ordered.append(size)
    return ordered


def det_batch(size, batch: int, num_classes: int, seed: int) -> dict:
    """uint8 images with three rectangular objects each (boxes, labels, masks)."""
    import numpy as np
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    gen, (h, w) = torch.Generator().manual_seed(seed), size
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8))
        lo = torch.rand(3, 2, generator=gen) * 0.6
        hi = (lo + 0.1 + torch.rand(3, 2, generator=gen) * 0.3).clamp(max=1.0)
        scale = torch.tensor([w, h], dtype=torch.float32)
        boxes = torch.cat([lo * scale, hi * scale], 1).floor()
        masks = np.zeros((3, h, w), dtype=np.uint8)
        for i, (x1, y1, x2, y2) in enumerate(boxes.long().tolist()):
            masks[i, y1:y2, x1:x2] = 1
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w),
                                             scale_factor=(1.0, 1.0), pad_shape=(h, w)))
        sample.gt_instances = InstanceData(
            bboxes=boxes, labels=torch.randint(0, num_classes, (3, ), generator=gen),
            masks=BitmapMasks(masks, h, w))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def seg_batch(size, batch: int, num_classes: int, seed: int) -> dict:
    """uint8 images with blocky label maps (two rows of ignore=255)."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    gen, (h, w) = torch.Generator().manual_seed(seed), size
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8))
        coarse = torch.randint(0, num_classes, (1, 1, h // 32, w // 32), generator=gen).float()
        seg = nn.functional.interpolate(coarse, size=(h, w), mode='nearest')[0].long()
        seg[:, :2] = 255
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w)))
        sample.gt_sem_seg = PixelData(data=seg)
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


# ------------------------------------------------------------------------------ measuring
def sync(device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


_LIBC = ctypes.CDLL(ctypes.util.find_library('c')) if ctypes.util.find_library('c') else None


def _settle() -> None:
    """Collect garbage and hand glibc's free pages back, so RSS reflects live memory."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, 'malloc_trim'):
        _LIBC.malloc_trim(0)


def _status_kib(field: str) -> Optional[int]:
    try:
        with open('/proc/self/status') as f:
            found = re.search(rf'^{field}:\s+(\d+) kB', f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def peak_bytes(fn, device) -> Optional[int]:
    """Peak memory increase during ``fn()``: CUDA max_memory_allocated over the allocation
    before; CPU the resident high-water mark (VmHWM, reset by writing 5 to
    /proc/self/clear_refs) over the RSS before. None where the reset is refused. On the CPU
    call it in a process started with :data:`EXACT_HEAP` (see :func:`peaks_in_child`)."""
    _settle()
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
        fn()
        return None
    before = _status_kib('VmRSS')
    fn()
    return max(0, max(_status_kib('VmHWM'), _status_kib('VmRSS')) - before) * 1024


# glibc: every block of 128 KiB or more mapped on its own and unmapped when freed
EXACT_HEAP = dict(MALLOC_MMAP_THRESHOLD_='131072', MALLOC_TRIM_THRESHOLD_='131072')


def peaks_in_child(case: dict, args, names: List[str], warmup, size, index: int) -> dict:
    """CPU peak memory of each variant in ``names`` (warm-up call at ``warmup``, then the peak of
    one call at ``size``), measured in a fresh process of this tool started with
    :data:`EXACT_HEAP`. In a process that has already run other cases glibc serves blocks of up
    to 32 MiB from heap space it keeps resident after they are freed, so the high-water mark
    counts memory the call no longer holds (a with_cp step read 1.3 GiB there against 0.44 GiB
    in a fresh process). Returns ``{name: bytes or None}``; a failure raises RuntimeError."""
    spec = dict(case=case, args=vars(args), names=names, warmup=warmup, size=size, index=index,
                backbone=BACKBONES.get(case['model']))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), '--peak-child'],
                          input=json.dumps(spec), capture_output=True, text=True,
                          env=dict(os.environ, **EXACT_HEAP))
    if proc.returncode != 0:
        raise RuntimeError(f'peak measurement failed: {proc.stderr.strip()[-500:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _peak_child() -> int:
    """The process :func:`peaks_in_child` starts: the spec on stdin, the peaks (JSON) on the
    last line of stdout."""
    spec = json.load(sys.stdin)
    args = argparse.Namespace(**spec['args'])
    device = torch.device('cpu')
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    if spec['backbone'] is not None:
        BACKBONES[spec['case']['model']] = spec['backbone']
    import mmvitswin  # noqa: F401
    subject = Subject(spec['case'], args, device)
    peaks = {}
    for name in spec['names']:
        model = subject.variant(name)
        call = make_call(spec['case']['kind'], model, name.split()[1], device)
        call(subject.make_input(tuple(spec['warmup']), 0))
        x = subject.make_input(tuple(spec['size']), spec['index'])
        peaks[name] = peak_bytes(lambda: call(x), device)
        del model, call, x
    print(json.dumps(peaks))
    return 0


def machine_info(device) -> dict:
    info = dict(cpu=next((ln.split(':', 1)[1].strip() for ln in open('/proc/cpuinfo')
                          if ln.startswith('model name')), platform.processor()),
                cpus=len(os.sched_getaffinity(0)), load_average=list(os.getloadavg()),
                python=platform.python_version(), torch=torch.__version__,
                threads=torch.get_num_threads(), device=str(device),
                OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS'))
    for name in ('mmengine', 'mmcv', 'mmdet', 'mmseg'):
        info[name] = getattr(sys.modules.get(name) or __import__(name), '__version__', None)
    if device.type == 'cuda':
        info['gpu'] = torch.cuda.get_device_name(device)
    else:
        from mmvitswin.openmmlab.engine.amp import cpu_bf16_support
        info['cpu_bf16'] = cpu_bf16_support()[1]
    try:
        import subprocess
        info['commit'] = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT,
                                        capture_output=True, text=True).stdout.strip() or None
    except OSError:
        info['commit'] = None
    return info


# ------------------------------------------------------------------------------ models
def host_swin(host: str):
    if host == 'mmseg':
        from mmseg.models.backbones.swin import SwinTransformer
    else:
        from mmdet.models.backbones.swin import SwinTransformer
    return SwinTransformer


def reference_backbone(host: str, cfg: dict, state: dict) -> Optional[nn.Module]:
    """The host's own Swin from the same kwargs (those it takes) with ``state``; None for a
    backbone that has no reference."""
    if str(cfg['type']).split('.')[-1] != 'SwinTransformer':
        return None
    cls = host_swin(host)
    accepted = inspect.signature(cls.__init__).parameters
    ref = cls(**{k: v for k, v in cfg.items() if k in accepted and k != 'type'})
    ref.load_state_dict(state, strict=True)
    return ref


def _to_bn(node):
    if isinstance(node, dict):
        return {k: 'BN' if (k == 'type' and v == 'SyncBN') else _to_bn(v) for k, v in node.items()}
    return type(node)(_to_bn(v) for v in node) if isinstance(node, (list, tuple)) else node


class Subject:
    """Builds a case's variants (each its own copy, so per-shape caches start cold) and the
    input for a given size."""

    def __init__(self, case: dict, args, device):
        from mmengine.config import Config, ConfigDict
        from mmengine.registry import DefaultScope
        from mmvitswin.openmmlab.registry import MODELS
        self.case, self.args, self.device = case, args, device
        torch.manual_seed(args.seed)
        if case['kind'] == 'whole':
            host, rel = WHOLE[case['model']]
            path = os.path.join(os.path.dirname(__import__(host).__file__), '.mim', 'configs', rel)
            cfg = Config.fromfile(path)
            self.host = host
            model_cfg = ConfigDict(_to_bn(cfg.model.to_dict()))
            model_cfg.pop('pretrained', None)
            model_cfg.backbone.update(init_cfg=None, drop_path_rate=0.0,
                                      **case.get('backbone_kwargs', {}))
            if host == 'mmseg':  # pad to the drawn size (a multiple of 32), not the 512 crop
                model_cfg.data_preprocessor.update(size=None, size_divisor=32)
            registry = __import__(f'{host}.registry', fromlist=['MODELS']).MODELS
            with DefaultScope.overwrite_default_scope(host):
                self.base = registry.build(copy.deepcopy(model_cfg))
            self.base.init_weights()
            self.backbone_cfg = dict(model_cfg.backbone)
            heads = model_cfg.get('roi_head') or {}
            self.num_classes = (heads['bbox_head']['num_classes'] if heads else
                                model_cfg.decode_head.num_classes)
        else:
            self.host = args.reference
            self.backbone_cfg = dict(copy.deepcopy(BACKBONES[case['model']]), init_cfg=None,
                                     **case.get('backbone_kwargs', {}))
            self.frames = self.backbone_cfg.pop('frames', None)
            self.base = MODELS.build(copy.deepcopy(self.backbone_cfg))
        self.state = copy.deepcopy(self.base.state_dict())
        bb_state = self.state if case['kind'] != 'whole' else self.base.backbone.state_dict()
        self.ref = (reference_backbone(self.host, self.backbone_cfg, bb_state)
                    if args.reference != 'none' else None)

    def variant(self, name: str) -> Optional[nn.Module]:
        impl, *flags = name.split()
        if impl == 'ref' and self.ref is None:
            return None
        if self.case['kind'] == 'whole':
            model = copy.deepcopy(self.base)
            if impl == 'ref':
                model.backbone = copy.deepcopy(self.ref)
            if 'sep' in flags:
                separable_roi_layers(model)
            if 'nhwc' in flags:
                channels_last_mask_heads(model)
        elif 'cp' in flags:
            from mmvitswin.openmmlab.registry import MODELS
            cfg = dict(self.backbone_cfg, with_cp=True)
            if impl == 'ref':
                accepted = inspect.signature(host_swin(self.host).__init__).parameters
                model = host_swin(self.host)(**{k: v for k, v in cfg.items()
                                                if k in accepted and k != 'type'})
            else:
                model = MODELS.build(cfg)
            model.load_state_dict(self.ref.state_dict() if impl == 'ref' else self.state)
        else:
            model = copy.deepcopy(self.ref if impl == 'ref' else self.base)
        model.to(self.device)
        model.train(self.case['kind'] in ('train', 'whole', 'rss_train'))  # mmdet's train() returns None
        if 'compiled' in flags or self.args.compile:
            compile_blocks(model)
        return model

    def make_input(self, size, index: int):
        batch, seed = self.case.get('batch', 1), self.args.seed * 100003 + index
        if self.case['kind'] == 'whole':
            make = det_batch if self.host == 'mmdet' else seg_batch
            return make(size, batch, self.num_classes, seed)
        gen = torch.Generator().manual_seed(seed)
        shape = (batch, 3) + ((self.frames, ) if self.frames else ()) + tuple(size)
        return torch.randn(shape, generator=gen).to(self.device)


def separable_roi_layers(model: nn.Module) -> int:
    """Replace every mmcv ``RoIAlign`` in ``model`` by a ``SeparableRoIAlign`` of the same
    settings (what ``SeparableRoIExtractor`` builds); returns how many were replaced."""
    from mmcv.ops import RoIAlign
    from mmvitswin.core.ops import SeparableRoIAlign
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, RoIAlign) and child.pool_mode == 'avg':
                setattr(module, name, SeparableRoIAlign(
                    child.output_size, child.spatial_scale, child.sampling_ratio,
                    aligned=child.aligned))
                swapped += 1
    return swapped


def channels_last_mask_heads(model: nn.Module) -> int:
    """Turn every mmdet ``FCNMaskHead`` in ``model`` into a ``ChannelsLastFCNMaskHead`` (same
    parameters, only the forward differs); returns how many were changed."""
    from mmdet.models.roi_heads.mask_heads import FCNMaskHead
    from mmvitswin.openmmlab.models import ChannelsLastFCNMaskHead
    changed = 0
    for module in model.modules():
        if type(module) is FCNMaskHead:
            module.__class__ = ChannelsLastFCNMaskHead
            changed += 1
    return changed


def compile_blocks(model: nn.Module) -> int:
    """Regional compilation: ``torch.compile(dynamic=True)`` each module of every repeated run
    of blocks (an ``nn.ModuleList`` of two or more modules of one class that holds no such run
    itself, e.g. a Swin stage's blocks), in place; the rest stays eager. Blocks of one class and
    width share a compiled graph, so a model compiles in a few minutes where the whole graph
    takes many more, and dynamic shapes spare a recompilation per input size. Returns the
    number of compiled modules."""
    def runs(module):
        return [m for m in module.children() if isinstance(m, nn.ModuleList) and len(m) > 1
                and len({type(b) for b in m}) == 1]

    def inner(module) -> bool:
        return any(runs(m) for m in module.modules())

    from torch._dynamo import config as dynamo_config
    for attr in ('recompile_limit', 'cache_size_limit'):  # one entry per block width, shift,
        if hasattr(dynamo_config, attr):                  # dtype: more than the default 8
            setattr(dynamo_config, attr, max(getattr(dynamo_config, attr), 512))
    count = 0
    for module in list(model.modules()):
        for blocks in runs(module):
            if any(inner(b) for b in blocks):
                continue
            for i, block in enumerate(blocks):
                blocks[i] = torch.compile(block, dynamic=True)
                count += 1
    return count


def _levels(out) -> List[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)


def optim_wrapper(model: nn.Module, dtype: str, device):
    """The optim wrapper tools/train.py (--amp) would use: AdamW, plus autocast for bf16/fp16."""
    from mmvitswin.openmmlab.engine.amp import apply_amp
    from mmvitswin.openmmlab.registry import OPTIM_WRAPPERS
    cfg = dict(type='OptimWrapper')
    if dtype != 'fp32':
        apply_amp(cfg, device.type == 'cuda', dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    cfg['optimizer'] = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05)
    return OPTIM_WRAPPERS.build(cfg)


def make_call(kind: str, model: nn.Module, dtype: str, device):
    """The timed work of one variant: ``call(input)``."""
    if kind in ('forward', 'rss'):
        def call(x):
            with torch.no_grad(), compat.autocast(device.type, DTYPES[dtype],
                                                  enabled=dtype != 'fp32'):
                return model(x)
        return call
    wrapper = optim_wrapper(model, dtype, device)
    if kind == 'whole':  # what the Runner does: preprocess + loss under optim_context, update
        return lambda batch: model.train_step(copy.deepcopy(batch), wrapper)

    def step(x):
        with wrapper.optim_context(model):
            loss = sum(o.float().square().mean() for o in _levels(model(x)))
        wrapper.update_params(loss)
    return step


# ------------------------------------------------------------------------------ a case
def run_case(case: dict, args, device) -> dict:
    count = args.count if args.count is not None and case['count'] else case['count']
    rows = []
    for label, subj, base, metric in case['rows']:
        label, subj, base = (n and n.replace('bf16', args.dtype) for n in (label, subj, base))
        label = label.replace('{count}', str(count))
        if (not args.only or any(s in label for s in args.only)) and not any(
                s in label for s in args.skip or ()):
            rows.append(dict(label=label + (' [compiled]' if args.compile else ''),
                             subject=subj, baseline=base, metric=metric))
    if not rows:
        return dict(case=case, rows=[])
    sizes = (draw_grid_sizes(count + 1, *case['sides'], args.seed) if 'sides' in case
             else draw_sizes(count + 1, case['scale'], args.seed))
    subject = Subject(case, args, device)
    names = []
    for r in rows:
        r['reference'] = subject.host if subject.ref is not None else None
        names += [n for n in (r['subject'], r['baseline']) if n and n not in names]
    calls = {}
    for name in names:
        model = subject.variant(name)
        if model is not None:
            calls[name] = make_call(case['kind'], model, name.split()[1], device)
    record = dict(case=case, sizes=sizes, variants={n: dict(first=[], again=[]) for n in calls})

    def run(name, fn):
        """fn() for a variant that has not failed; a failure is recorded, the others go on."""
        variant = record['variants'][name]
        if 'error' in variant:
            return None
        try:
            return fn()
        except Exception as exc:  # e.g. a compile error in one model: keep the others' figures
            traceback.print_exc()
            variant['error'] = f'{type(exc).__name__}: {exc}'.splitlines()[0][:200]
            return None

    def timed(name, x):
        def fn():
            sync(device)
            start = time.perf_counter()
            calls[name](x)
            sync(device)
            return time.perf_counter() - start
        return run(name, fn)

    def rss_growth(name):
        calls[name](subject.make_input(sizes[0], 0))
        _settle()
        before = _status_kib('VmRSS')
        for i, size in enumerate(sizes[1:], 1):
            calls[name](subject.make_input(size, i))
        _settle()
        return (_status_kib('VmRSS') - before) * 1024

    order = list(calls)
    if case['kind'].startswith('rss'):  # one variant after the other: RSS is the whole process's
        for name in sorted(order, key=lambda n: not n.startswith('ref')):
            record['variants'][name]['rss_growth_bytes'] = run(name, lambda: rss_growth(name))
    else:
        for name in order:  # warm-up at a size no pass uses
            timed(name, subject.make_input(sizes[0], 0))
        for phase in ('first', 'again'):
            for i, size in enumerate(sizes[1:], 1):
                x = subject.make_input(size, i)
                for name in (order if i % 2 else order[::-1]):
                    t = timed(name, x)
                    if t is not None:
                        record['variants'][name][phase].append(t)
                del x
        if any(r['metric'] == 'peak' for r in rows):
            big = max(sizes, key=lambda s: s[0] * s[1])
            record['peak_size'] = big
            index = sizes.index(big)
            if device.type == 'cpu':
                names = [n for r in rows if r['metric'] == 'peak'
                         for n in (r['subject'], r['baseline']) if n in calls]
                names = list(dict.fromkeys(names))
                try:
                    peaks = peaks_in_child(case, args, names, sizes[0], big, index)
                except RuntimeError as exc:  # keep the times; the peak rows show the error
                    print(exc, file=sys.stderr)
                    peaks = {}
                    for name in names:
                        record['variants'][name]['error'] = str(exc).splitlines()[0][:200]
                for name in names:
                    record['variants'][name]['peak_bytes'] = peaks.get(name)
            else:
                x = subject.make_input(big, index)
                for name in order:
                    record['variants'][name]['peak_bytes'] = run(
                        name, lambda: peak_bytes(lambda: calls[name](x), device))
    record['rows'] = [dict(r, **summarize_row(r, record['variants'])) for r in rows]
    return record


def summarize_row(row: dict, variants: dict) -> dict:
    s, b = variants.get(row['subject']), variants.get(row['baseline'])
    out = {}
    if s is None or 'error' in s:
        return dict(error=(s or {}).get('error') or f"variant {row['subject']} not built")
    if b is not None and 'error' in b:
        out['baseline_error'], b = b['error'], None
    if row['metric'] == 'time':
        for phase in ('first', 'again'):
            ts, tb = s[phase], (b or {}).get(phase)
            out[f'{phase}_ms'] = 1e3 * sum(ts) / len(ts) if ts else None
            out[f'{phase}_ms_baseline'] = 1e3 * sum(tb) / len(tb) if tb else None
            out[f'{phase}_speedup'] = sum(tb) / sum(ts) if ts and tb else None
    elif row['metric'] == 'peak':
        ps, pb = s.get('peak_bytes'), (b or {}).get('peak_bytes')
        out.update(peak_mib=ps and ps / MIB, peak_mib_baseline=pb and pb / MIB,
                   peak_ratio=ps / pb if ps and pb else None)
    else:
        gs, gb = s.get('rss_growth_bytes'), (b or {}).get('rss_growth_bytes')
        out.update(rss_mib=gs / MIB, rss_mib_baseline=None if gb is None else gb / MIB,
                   rss_diff_mib=None if gb is None else (gs - gb) / MIB)
    return out


# ------------------------------------------------------------------------------ report
def _f(value, digits=1):
    return '-' if value is None else f'{value:.{digits}f}'


def _names(r: dict) -> List[str]:
    """Label, subject, baseline with 'ref' spelled as the reference's package."""
    ref = r.get('reference') or 'ref'
    base = r['baseline'] if r['baseline'] and (r.get('reference') or 'ref' not in r['baseline']) \
        else None
    names = [re.sub(r'\bref\b', ref, n) if n else '-' for n in (r['label'], r['subject'], base)]
    if r.get('baseline_error'):
        names[2] += ' (failed)'
    return names


def render(report: dict) -> str:
    from tabulate import tabulate
    m, rows = report['machine'], [r for c in report['cases'] for r in c.get('rows', [])]
    lines = [f"# mmvitswin benchmark ({report['preset']})", '',
             f"{m['cpu']}, {m['cpus']} usable CPUs, {m['threads']} torch threads, "
             f"device {m['device']}{', ' + m['gpu'] if m.get('gpu') else ''}; torch {m['torch']}, "
             f"mmdet {m['mmdet']}, mmseg {m['mmseg']}; commit {m.get('commit')}; "
             f"load average {m['load_average'][0]:.1f} at start, "
             f"{report['load_average_end'][0]:.1f} at end; {report['wall_s']:.0f} s.", '']
    if any(r['metric'] != 'rss' for r in rows):
        lines += ['Times: mean ms per call over the sizes of a pass; speed-up = baseline / '
                  'subject (> 1: subject faster). Peak: memory increase during one call at the '
                  'largest size; ratio = subject / baseline.', '']
    timed = [[*_names(r), _f(r.get('first_ms')),
              _f(r.get('first_ms_baseline')), _f(r.get('first_speedup'), 2),
              _f(r.get('again_ms')), _f(r.get('again_ms_baseline')),
              _f(r.get('again_speedup'), 2)] if 'error' not in r else
             [*_names(r), 'error: ' + r['error'][:60]]
             for r in rows if r['metric'] == 'time']
    if timed:
        lines += ['## Time (new sizes, then the same sizes again)', '', tabulate(
            timed, ['row', 'subject', 'baseline', 'new: subj ms', 'new: base ms', 'new: speed-up',
                    'seen: subj ms', 'seen: base ms', 'seen: speed-up'],
            tablefmt='github', disable_numparse=True), '']
    peak = [[*_names(r), _f(r.get('peak_mib'), 0),
             _f(r.get('peak_mib_baseline'), 0), _f(r.get('peak_ratio'), 2)]
            for r in rows if r['metric'] == 'peak']
    if peak:
        lines += ['## Peak memory', '', tabulate(
            peak, ['row', 'subject', 'baseline', 'subj MiB', 'base MiB', 'ratio'],
            tablefmt='github', disable_numparse=True), '']
    rss = [[*_names(r), _f(r.get('rss_mib')),
            _f(r.get('rss_mib_baseline')), _f(r.get('rss_diff_mib'))]
           for r in rows if r['metric'] == 'rss']
    if rss:
        lines += ['## Resident memory growth over new input sizes', '', tabulate(
            rss, ['row', 'subject', 'baseline', 'subj MiB', 'base MiB', 'subj - base MiB'],
            tablefmt='github', disable_numparse=True), '']
    errors = [c for c in report['cases'] if c.get('error')]
    for c in errors:
        lines.append(f"- error in case {c['case']['model']} {c['case']['kind']}: {c['error']}")
    for c in report['cases']:
        for name, v in c.get('variants', {}).items():
            if 'error' in v:
                lines.append(f"- error in {c['case']['model']} {c['case']['kind']}, variant "
                             f"{name}: {v['error']}")
    sizes = [c for c in report['cases'] if c.get('sizes')]
    for c in sizes:
        lines.append(f"- sizes of {c['case']['model']} {c['case']['kind']} (warm-up first): "
                     + ', '.join(f'{h}x{w}' for h, w in c['sizes'][:12])
                     + (' ...' if len(c['sizes']) > 12 else ''))
    return '\n'.join(lines) + '\n'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--preset', choices=sorted(PRESETS), default='standard')
    p.add_argument('--cases', help='JSON or YAML file with a list of cases (instead of --preset)')
    p.add_argument('--only', nargs='+', help='run only rows whose label contains one of these')
    p.add_argument('--skip', nargs='+', help='leave out rows whose label contains one of these')
    p.add_argument('--backbone', help='registered type replacing Swin-T in the backbone cases')
    p.add_argument('--backbone-kwargs', default='{}', help='JSON merged into that backbone')
    p.add_argument('--reference', choices=['mmdet', 'mmseg', 'none'], default='mmdet',
                   help='whose Swin the backbone cases compare with (whole models: the host)')
    p.add_argument('--dtype', choices=['bf16', 'fp16'], default='bf16',
                   help='the low precision of the autocast rows (fp16: CUDA)')
    p.add_argument('--compile', action='store_true',
                   help='compile every variant (compile_blocks: each block, dynamic shapes)')
    p.add_argument('--count', type=int, help='sizes per pass, overriding every case')
    p.add_argument('--device', default='cpu')
    p.add_argument('--threads', type=int, help='torch threads (default: every usable CPU)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out-dir', default='bench_out')
    args = p.parse_args(argv)
    if args.count is not None and args.count < 1:
        p.error('--count must be >= 1')
    return args


def load_cases(args) -> List[dict]:
    if args.cases:
        import yaml
        with open(args.cases) as f:
            cases = yaml.safe_load(f)  # JSON is YAML too
    else:
        cases = copy.deepcopy(PRESETS[args.preset])
    if args.backbone or args.backbone_kwargs != '{}':
        kwargs = json.loads(args.backbone_kwargs)
        base = dict(BACKBONES['swin_t'], type=args.backbone) if args.backbone else \
            dict(BACKBONES['swin_t'])
        BACKBONES['custom'] = dict(base, **kwargs)
        for case in cases:
            if case['model'] == 'swin_t' and case['kind'] != 'whole':
                case['model'] = 'custom'
    return cases


def main(argv=None) -> int:
    if (argv if argv is not None else sys.argv[1:]) == ['--peak-child']:
        return _peak_child()
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    if device.type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    import mmvitswin  # noqa: F401  (registers ours, bridges into mmdet/mmseg)
    from mmengine.logging import MMLogger
    MMLogger.get_instance('mmvitswin-benchmark', log_level='WARNING')
    start = time.perf_counter()
    report = dict(preset=args.cases or args.preset, settings=vars(args),
                  machine=machine_info(device), cases=[])
    errors = 0
    for case in load_cases(args):
        t0 = time.perf_counter()
        try:
            record = run_case(case, args, device)
        except Exception as exc:  # one broken case must not lose the others' figures
            errors += 1
            traceback.print_exc()
            record = dict(case=case, error=f'{type(exc).__name__}: {exc}'.splitlines()[0][:300],
                          rows=[dict(label=r[0], subject=r[1], baseline=r[2], metric=r[3],
                                     error=type(exc).__name__) for r in case['rows']])
        record['wall_s'] = time.perf_counter() - t0
        errors += sum('error' in v for v in record.get('variants', {}).values())
        report['cases'].append(record)
        for row in record.get('rows', []):
            print(f"[bench] {row['label']}: " + ', '.join(
                f'{k} {_f(v, 2)}' for k, v in row.items()
                if k.endswith(('ms', 'speedup', 'ratio', 'mib')) and v is not None)
                + (f" ERROR {row['error']}" if 'error' in row else ''), file=sys.stderr,
                flush=True)
    report.update(wall_s=time.perf_counter() - start, load_average_end=list(os.getloadavg()),
                  errors=errors)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, 'benchmark.json'), 'w') as f:
        json.dump(report, f, indent=1, default=str)
    text = render(report)
    with open(os.path.join(args.out_dir, 'benchmark.md'), 'w') as f:
        f.write(text)
    print(text)
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())

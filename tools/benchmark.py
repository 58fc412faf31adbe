#!/usr/bin/env python
"""Speed and memory of mmvitswin's backbones and whole models against mmdet's/mmseg's own, on
the workload users run: a new input size on almost every call.

A *case* builds a few *variants* of one model -- ours or the reference (the host's own Swin with
our weights), fp32 or autocast to bf16/fp16, with_cp, torch.compile -- and feeds them the same
inputs, interleaved call by call (the order alternates, so a load change hits all alike). Sizes
are drawn like mmdet's multi-scale resize in the Mask R-CNN Swin 3x recipe (short side 480-800
in steps of 32, long side <= 1333, aspect kept), scaled by the case's ``scale`` and padded to a
multiple of 32, seeded. Each size is fed twice: a first-seen pass and a seen-again pass, reported
apart (per-shape JIT and caches cost in the first; oneDNN's primitive cache is sized so that
the variants do not evict each other's, see ``ONEDNN_CACHE``). A *row* compares two variants:

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

# oneDNN (torch's CPU kernels for bf16 matmuls, convolutions, some elementwise ops) builds one
# primitive per op shape and keeps it in one cache per process: 1024 entries by default, the
# least recently used dropped. A user's process runs one model, whose primitives for the sizes
# it has seen stay there (SwinV2-T's bf16 train step over a pass's 13 sizes: 859 of ours, 667 of
# HF's; a second pass missed none, either model alone). The variants of a case share this
# process, and together they overflow the default: they evicted each other's primitives
# between passes, and each seen size rebuilt them (ours 44 per bf16 train step, about 35 ms;
# HF's 22, 17 ms). Room for eight variants' worth gives each what it has alone; a value set
# in the environment is kept. Read before torch builds its first primitive.
ONEDNN_CACHE = int(os.environ.setdefault('ONEDNN_PRIMITIVE_CACHE_CAPACITY', str(8 * 1024)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from mmvitswin.core import compat  # noqa: E402  (torch-version differences: autocast)
from mmvitswin.core.layers import set_fast_path, switch  # noqa: E402

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
    # DINOv2-B ViT-Adapter (all blocks global, as HF's) against HF's Dinov2Backbone on the same
    # weights (``reference``: the baseline is built from our trunk, not from the host)
    'vit_adapter_dinov2_b_simple': dict(type='ViTAdapter', arch='dinov2-b', adapter='simple',
                                        reference='hf-dinov2'),
    'vit_adapter_dinov2_b_interaction': dict(type='ViTAdapter', arch='dinov2-b',
                                             adapter='interaction', reference='hf-dinov2'),
    'vit_adapter_dinov2_tiny_test': dict(
        type='ViTAdapter', arch=dict(embed_dims=64, num_layers=2, num_heads=2,
                                     feedforward_channels=256),
        patch_size=14, img_size=56, layer_scale_init_value=1e-5, final_norm=True,
        adapter='interaction', adapter_cfg=dict(num_heads=2, conv_inplane=16, n_points=2,
                                                interaction_indexes=[(0, 1), (1, 2)]),
        reference='hf-dinov2'),
    # Swin V2-T at the detection configs' window 16 against HF's Swinv2Backbone on the same
    # weights (HF's random ones, through our checkpoint family)
    'swinv2_t': dict(type='SwinTransformerV2', arch='tiny', window_size=16,
                     pretrained_window_sizes=(16, 16, 16, 8), reference='hf-swinv2'),
    'swinv2_tiny_test': dict(type='SwinTransformerV2', embed_dims=32, depths=[1, 1, 1, 1],
                             num_heads=[1, 2, 4, 8], window_size=8, reference='hf-swinv2'),
}
# A case: kind (forward | train | whole | rss | rss_train), model (a BACKBONES or WHOLE key),
# scale (of the recipe's sizes) or sides (low, high: H and W drawn independently), count (sizes
# per pass), batch, rows: [label, subject, baseline, metric], optional backbone_kwargs (merged
# into the backbone config).
# A variant is 'ours'|'ref' + dtype, then optional flags: ' cp' (with_cp=True), ' compiled'
# (compile_blocks), ' sep' (whole detectors: RoI layers -> SeparableRoIAlign), ' nhwc' (whole
# detectors: FCNMaskHead -> ChannelsLastFCNMaskHead), ' plain' / ' fast' (our layers' special
# fast path forced off / on while the variant runs, whatever MMVITSWIN_FAST_PATH says: an A/B
# of the switch in one process); 'bf16' follows --dtype. --compile adds
# ' compiled' to every variant.
_SWIN = dict(model='swin_t', scale=0.4, batch=1)


def _swin_speed_rows(kind: str, suffix: str = '') -> list:
    """The fp32 and bf16 time rows of a Swin-T forward or train-step case."""
    what = 'forward' if kind == 'forward' else 'train step'
    amp = '' if kind == 'forward' else ' AMP'
    return [[f'Swin-T {what} fp32{suffix}', 'ours fp32', 'ref fp32', 'time'],
            [f'Swin-T {what} bf16{amp} vs ref fp32{suffix}', 'ours bf16', 'ref fp32', 'time'],
            [f'Swin-T {what} bf16{amp} vs ref bf16{suffix}', 'ours bf16', 'ref bf16', 'time']]


def _swinv2_rows(prefix: str = 'SwinV2-T', kind: str = 'forward', suffix: str = '') -> list:
    """Swin V2 forward (or train-step: ``kind``) rows against HF's Swinv2Backbone on the same
    weights, fp32 and bf16 (autocast, for training with the AMP optimizer wrapper)."""
    what = 'forward' if kind == 'forward' else 'train step (fused AdamW)'
    return [[f'{prefix} {what} {d} vs HF Swinv2Backbone {d}{suffix}', f'ours {d}', f'ref {d}',
             'time'] for d in ('fp32', 'bf16')]


def _dinov2_rows(adapter: str) -> list:
    """DINOv2-B ViTAdapter rows against HF's Dinov2Backbone (its stride-14 map only), fp32
    and bf16, at the detection recipe's sizes scaled by 0.6 (a new size every call)."""
    name = f'ViTAdapter DINOv2-B {adapter}'
    return [[f'{name} forward fp32 vs HF Dinov2Backbone fp32', 'ours fp32', 'ref fp32', 'time'],
            [f'{name} forward bf16 vs HF Dinov2Backbone bf16', 'ours bf16', 'ref bf16', 'time']]


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
        dict(model='vit_adapter_dinov2_b_simple', kind='forward', scale=0.6, count=3, batch=1,
             rows=_dinov2_rows('simple')),
        dict(model='swinv2_t', kind='forward', scale=0.4, count=6, batch=1,
             rows=_swinv2_rows()),
        # fused AdamW on both sides: what HF's Trainer runs by default (optim
        # 'adamw_torch_fused') and what our Swin V2 configs ask for (fused='auto')
        dict(model='swinv2_t', kind='train', scale=0.4, count=3, batch=1, fused_adamw=True,
             rows=_swinv2_rows(kind='train')),
        # the detection recipe's own sizes, where a detection run trains
        dict(model='swinv2_t', kind='forward', scale=1.0, count=3, batch=1,
             rows=_swinv2_rows(suffix=', recipe sizes')),
        dict(model='swinv2_t', kind='train', scale=1.0, count=2, batch=1, fused_adamw=True,
             rows=_swinv2_rows(kind='train', suffix=', recipe sizes')),
        dict(model='vit_adapter_dinov2_b_interaction', kind='forward', scale=0.6, count=3,
             batch=1, rows=_dinov2_rows('interaction')),
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
        dict(model='swinv2_tiny_test', kind='forward', scale=0.15, count=1, batch=1,
             rows=_swinv2_rows('tiny SwinV2')),
        dict(model='vit_adapter_dinov2_tiny_test', kind='forward', scale=0.15, count=1, batch=1,
             rows=[['tiny DINOv2 ViTAdapter forward fp32 vs HF Dinov2Backbone', 'ours fp32',
                    'ref fp32', 'time'],
                   ['tiny DINOv2 ViTAdapter forward bf16 vs HF Dinov2Backbone bf16',
                    'ours bf16', 'ref bf16', 'time']]),
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
        call = make_variant_call(spec['case']['kind'], model, name, device,
                                 spec['case'].get('fused_adamw', False))
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
                OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS'),
                onednn_primitive_cache=ONEDNN_CACHE)
    for name in ('mmengine', 'mmcv', 'mmdet', 'mmseg'):
        info[name] = getattr(sys.modules.get(name) or __import__(name), '__version__', None)
    if device.type == 'cuda':
        info['gpu'] = torch.cuda.get_device_name(device)
    else:
        from mmvitswin.openmmlab.engine.amp import cpu_bf16_support
        info['cpu_bf16'] = cpu_bf16_support()[1]
        info['cpu_capability'] = switch.cpu_capability()
    # what the layers' fast path does for variants without ' plain' / ' fast'
    info['fast_path'] = switch.fast_path_setting()
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


class HFDinov2Reference(nn.Module):
    """HF ``Dinov2Backbone`` (or ``Dinov2WithRegistersBackbone``) built and loaded from one of
    our DINOv2 trunks: same width, depth, heads, patch, LayerScale, registers, FFN, weights;
    returns its last block's (layer-normed) map, as our trunk's final map."""

    def __init__(self, model: nn.Module):
        super().__init__()
        import transformers
        regs = model.num_register_tokens
        kwargs = dict(hidden_size=model.embed_dims, num_hidden_layers=model.num_layers,
                      num_attention_heads=model.num_heads,
                      # HF's SwiGLU width is DINOv2's 2/3 rule of a 4x MLP
                      mlp_ratio=4 if model.ffn_type == 'swiglu' else
                      model.feedforward_channels // model.embed_dims,
                      image_size=model.img_size[0], patch_size=model.patch_size,
                      layer_norm_eps=model.norm_eps, use_swiglu_ffn=model.ffn_type == 'swiglu',
                      out_features=[f'stage{model.num_layers}'])
        if regs:
            config = transformers.Dinov2WithRegistersConfig(num_register_tokens=regs, **kwargs)
            self.hf = transformers.Dinov2WithRegistersBackbone(config)
        else:
            self.hf = transformers.Dinov2Backbone(transformers.Dinov2Config(**kwargs))
        state = hf_dinov2_state(model.state_dict(), model.num_layers)
        if 'encoder.layer.0.attention.attention.query.weight' in self.hf.state_dict():
            state = hf_dinov2_legacy_names(state)
        missing = self.hf.load_state_dict(state, strict=False).missing_keys
        if [k for k in missing if not k.endswith('mask_token')]:
            raise RuntimeError(f'HF reference: weights missing for {missing[:4]}')

    def forward(self, x: torch.Tensor):
        return tuple(self.hf(pixel_values=x).feature_maps)


class HFSwinv2Reference(nn.Module):
    """HF ``Swinv2Backbone`` with one of our SwinTransformerV2's configs; building it gives our
    model HF's (random) weights through our checkpoint family, so both run the same weights.
    HF's ``image_size`` is large so that it never shrinks a window: full shifted windows on
    padded maps at every size, as ours. Returns HF's stage maps (it has no output norms)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        import transformers
        if len(set(model.window_sizes)) != 1:
            raise ValueError(f'HF Swin V2 has one square window for all stages, the model has '
                             f'{model.window_sizes}')
        block = model.stages[0].blocks[0]
        config = transformers.Swinv2Config(
            image_size=4096, patch_size=model.patch_size, embed_dim=model.num_features[0],
            depths=list(model.depths), num_heads=list(model.num_heads),
            window_size=model.window_sizes[0][0],
            pretrained_window_sizes=[p[0] for p in model.pretrained_window_sizes],
            mlp_ratio=block.ffn.layers[0][0].out_features / model.num_features[0],
            drop_path_rate=0., out_features=[f'stage{i + 1}' for i in model.out_indices])
        self.hf = transformers.Swinv2Backbone(config).eval()
        sd = model.convert_checkpoint(self.hf.state_dict())
        missing = model.load_state_dict(sd, strict=False).missing_keys
        if [k for k in missing if not k.startswith('norm')]:  # only our output norms
            raise RuntimeError(f'HF Swin V2 reference: weights missing for {missing[:4]}')

    def forward(self, x: torch.Tensor):
        return tuple(self.hf(pixel_values=x).feature_maps)


def hf_dinov2_state(state: dict, num_layers: int) -> dict:
    """Our trunk's keys -> the module names of transformers' Dinov2 models (>= 5)."""
    out = {'embeddings.cls_token': state['cls_token'],
           'embeddings.position_embeddings': state['pos_embed'],
           'embeddings.patch_embeddings.projection.weight': state['patch_embed.proj.weight'],
           'embeddings.patch_embeddings.projection.bias': state['patch_embed.proj.bias'],
           'layernorm.weight': state['norm.weight'], 'layernorm.bias': state['norm.bias']}
    if 'register_tokens' in state:
        out['embeddings.register_tokens'] = state['register_tokens']
    names = {'norm1': 'norm1', 'norm2': 'norm2', 'attn.proj': 'attention.o_proj',
             'ffn.layers.0.0': 'mlp.fc1', 'ffn.layers.1': 'mlp.fc2', 'ffn.w3': 'mlp.down_proj'}
    for i in range(num_layers):
        src, dst = f'blocks.{i}.', f'encoder.layer.{i}.'
        for kind in ('weight', 'bias'):
            for q, name in zip(state[src + f'attn.qkv.{kind}'].chunk(3), 'qkv'):
                out[dst + f'attention.{name}_proj.{kind}'] = q
            for ours, theirs in names.items():
                if src + f'{ours}.{kind}' in state:
                    out[dst + f'{theirs}.{kind}'] = state[src + f'{ours}.{kind}']
            if src + f'ffn.w12.{kind}' in state:
                gate, up = state[src + f'ffn.w12.{kind}'].chunk(2)
                out[dst + f'mlp.gate_proj.{kind}'], out[dst + f'mlp.up_proj.{kind}'] = gate, up
        out[dst + 'layer_scale1.lambda1'] = state[src + 'ls1.gamma']
        out[dst + 'layer_scale2.lambda1'] = state[src + 'ls2.gamma']
    return out


def hf_dinov2_legacy_names(state: dict) -> dict:
    """:func:`hf_dinov2_state`'s keys -> the module names of transformers before the
    attention refactor (still 5.17): ``attention.attention.query``, ``attention.output.dense``,
    the SwiGLU FFN as one ``weights_in`` (gate rows, then up rows) and ``weights_out``."""
    renames = (('attention.q_proj.', 'attention.attention.query.'),
               ('attention.k_proj.', 'attention.attention.key.'),
               ('attention.v_proj.', 'attention.attention.value.'),
               ('attention.o_proj.', 'attention.output.dense.'),
               ('mlp.down_proj.', 'mlp.weights_out.'))
    out = {}
    for key, value in state.items():
        if '.mlp.up_proj.' in key:
            continue
        if '.mlp.gate_proj.' in key:
            up = state[key.replace('.gate_proj.', '.up_proj.')]
            out[key.replace('.gate_proj.', '.weights_in.')] = torch.cat([value, up])
            continue
        for new, old in renames:
            key = key.replace(new, old)
        out[key] = value
    return out


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
            self.reference = self.backbone_cfg.pop('reference', None)
            self.base = MODELS.build(copy.deepcopy(self.backbone_cfg))
            if self.reference == 'hf-swinv2':  # gives self.base HF's weights
                self.hf_swinv2 = HFSwinv2Reference(self.base)
        self.state = copy.deepcopy(self.base.state_dict())
        bb_state = self.state if case['kind'] != 'whole' else self.base.backbone.state_dict()
        if args.reference == 'none':
            self.ref = None
        elif getattr(self, 'reference', None) == 'hf-dinov2':
            self.ref = HFDinov2Reference(self.base)
        elif getattr(self, 'reference', None) == 'hf-swinv2':
            self.ref = self.hf_swinv2
        else:
            self.ref = reference_backbone(self.host, self.backbone_cfg, bb_state)

    def variant(self, name: str) -> Optional[nn.Module]:
        impl, *flags = name.split()
        if impl in PEER_BUILDERS:  # timm's / HF's Swin with our weights; None if not built
            return build_peer(self, name)
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


def optim_wrapper(model: nn.Module, dtype: str, device, fused: bool = False):
    """The optim wrapper tools/train.py (--amp) would use: AdamW, plus autocast for bf16/fp16.
    ``fused``: torch's fused AdamW kernel where this torch has one for ``device`` (what our
    Swin V2 configs' ``fused='auto'`` and HF's ``Trainer`` by default run), its default
    otherwise."""
    from mmvitswin.openmmlab.engine.amp import apply_amp
    from mmvitswin.openmmlab.engine.grouped import GroupedOptimWrapperConstructor
    cfg = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05))
    if fused:
        cfg['optimizer']['fused'] = 'auto'
    if dtype != 'fp32':
        apply_amp(cfg, device.type == 'cuda', dtype)
    # no paramwise_cfg: one param group, as torch's AdamW over model.parameters()
    return GroupedOptimWrapperConstructor(cfg)(model)


def make_variant_call(kind: str, model: nn.Module, name: str, device, fused: bool = False):
    """:func:`make_call` for variant ``name``, run with the fast path forced off (' plain') or
    on (' fast') where the name says so, the switch's previous setting restored after."""
    call = make_call(kind, model, name.split()[1], device, fused)
    flags = name.split()[2:]
    forced = True if 'fast' in flags else False if 'plain' in flags else None
    if forced is None:
        return call

    def switched(x):
        previous = set_fast_path(forced)
        try:
            return call(x)
        finally:
            set_fast_path(previous)
    return switched


def make_call(kind: str, model: nn.Module, dtype: str, device, fused: bool = False):
    """The timed work of one variant: ``call(input)``; ``fused``: the train step's AdamW is
    the fused kernel (:func:`optim_wrapper`)."""
    if kind in ('forward', 'rss'):
        def call(x):
            with torch.no_grad(), compat.autocast(device.type, DTYPES[dtype],
                                                  enabled=dtype != 'fp32'):
                return model(x)
        return call
    wrapper = optim_wrapper(model, dtype, device, fused)
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
    add_peers(rows, case, args)
    sizes = (draw_grid_sizes(count + 1, *case['sides'], args.seed) if 'sides' in case
             else draw_sizes(count + 1, case['scale'], args.seed))
    subject = Subject(case, args, device)
    names = []
    for r in rows:
        # the baseline's package: HF for the HF-built references, else the host
        r['reference'] = (('HF' if getattr(subject, 'reference', None) else subject.host)
                          if subject.ref is not None else None)
        names += [n for n in (r['subject'], r['baseline'], *r.get('peers', ()))
                  if n and n not in names]
    calls = {}
    for name in names:
        model = subject.variant(name)
        if model is not None:
            calls[name] = make_variant_call(case['kind'], model, name, device,
                                            case.get('fused_adamw', False))
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
    record['roofline'] = case_roofline(case, subject, sizes, args, device, rows)
    record['rows'] = [dict(r, **summarize_row(r, record['variants']),
                           **summarize_more(r, record, subject)) for r in rows]
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


# ------------------------------------------------------------------------------ peers: timm, HF
# Each Swin time row whose baseline is the reference ('ref <dtype>') is also timed against timm's
# and HuggingFace's Swin in that precision ('timm <dtype>', 'hf <dtype>'): same weights (ours,
# moved into their layouts), same inputs, interleaved with the other variants of the case.
PEERS = ('timm', 'hf')
TIMM_SWIN = 'swin_tiny_patch4_window7_224'  # built with features_only=True, strict_img_size=False
_TIMM: Optional[tuple] = None  # (module or None, note): imported once per process


class _StubClass(type):
    """A torchvision name timm touches at import (a base class, an enum member): any attribute
    is another stub; calling one says it is not there."""

    def __getattr__(cls, name):
        if name.startswith('__'):
            raise AttributeError(name)
        return _StubClass(name, (), {})

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f'torchvision stub: {cls.__name__} is not available in this process')


class _StubModule(type(sys)):
    def __getattr__(self, name):
        if name.startswith('__'):
            raise AttributeError(name)
        return _StubClass(name, (), {})


class _TorchvisionStub:
    """Import hook answering every ``torchvision[.x]`` import with a stub module, while timm is
    imported; removed with its modules afterwards, so nothing else in the process sees it."""

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery
        if name == 'torchvision' or name.startswith('torchvision.'):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__, module.__version__ = [], '0.0.0+stub'
        return module

    def exec_module(self, module):
        pass


def _drop_modules(*packages: str) -> None:
    for name in [n for n in sys.modules if n.split('.')[0] in packages]:
        del sys.modules[name]


def import_timm() -> tuple:
    """``(timm or None, note)``. timm imports torchvision at import time; where that fails
    (torchvision missing, or its C++ ops not loading beside this torch) timm is imported once
    more with a torchvision stub in this process only, and the note says so."""
    global _TIMM
    if _TIMM is not None:
        return _TIMM
    try:
        import timm
        _TIMM = (timm, f'timm {timm.__version__}')
    except Exception as exc:  # noqa: BLE001  (ImportError, or torchvision's RuntimeError)
        first = f'{type(exc).__name__}: {exc}'.splitlines()[0][:160]
        _drop_modules('timm', 'torchvision')
        stub = _TorchvisionStub()
        sys.meta_path.insert(0, stub)
        try:
            import timm
            _TIMM = (timm, f'timm {timm.__version__} imported with a torchvision stub '
                           f'(import timm failed: {first})')
        except Exception as exc2:  # noqa: BLE001
            _drop_modules('timm')
            _TIMM = (None, f'timm not benchmarked: import failed ({first}), and with a '
                           f'torchvision stub too ({type(exc2).__name__}: {exc2})'[:400])
        finally:
            sys.meta_path.remove(stub)
            _drop_modules('torchvision')
    print(f'[bench] {_TIMM[1]}', file=sys.stderr, flush=True)
    return _TIMM


def swin_kwargs(cfg: dict, state: dict) -> dict:
    """The architecture of our Swin ``cfg`` as the peers need it: sizes read from its weights
    ``state`` (embed_dims, depths, num_heads, window_size, mlp_ratio, qkv_bias, patch_size,
    in_channels), the rest from ``cfg`` over the constructor's defaults. ValueError (naming the
    argument) for a Swin that timm's and HF's Swin cannot represent."""
    from mmvitswin.openmmlab.registry import MODELS
    kw = {}
    for klass in MODELS.get(cfg['type']).__mro__:  # the registered class forwards **kwargs
        for k, p in inspect.signature(klass.__init__).parameters.items():
            if p.default is not inspect.Parameter.empty:
                kw.setdefault(k, p.default)
    kw.update({k: v for k, v in cfg.items() if k != 'type'})
    embed, stages = state['patch_embed.projection.weight'], []
    while f'stages.{len(stages)}.blocks.0.norm1.weight' in state:
        stages.append(sum(1 for k in state if re.match(
            rf'stages\.{len(stages)}\.blocks\.\d+\.norm1\.weight$', k)))
    block = 'stages.{}.blocks.0.attn.w_msa.'
    tables = [state[block.format(s) + 'relative_position_bias_table'] for s in range(len(stages))]
    kw.update(embed_dims=embed.shape[0], in_channels=embed.shape[1], patch_size=embed.shape[2],
              depths=stages, num_heads=[t.shape[1] for t in tables],
              window_size=(round(tables[0].shape[0]**0.5) + 1) // 2,
              mlp_ratio=state['stages.0.blocks.0.ffn.layers.0.0.weight'].shape[0] / embed.shape[0],
              qkv_bias=block.format(0) + 'qkv.bias' in state)
    wanted = dict(patch_norm=True, use_abs_pos_embed=False, qk_scale=None,
                  strides=(kw['patch_size'], 2, 2, 2)[:len(stages)],
                  out_indices=tuple(range(len(stages))))
    for key, value in wanted.items():
        have = kw.get(key, value)
        if (tuple(have) if isinstance(have, (list, tuple)) else have) != value:
            raise ValueError(f'{key}={have!r}: the timm/HF peers are built for {value!r}')
    if kw['mlp_ratio'] == int(kw['mlp_ratio']):
        kw['mlp_ratio'] = int(kw['mlp_ratio'])
    return kw


def load_from_ours(peer: nn.Module, ours: dict, to_ours, unfilled: str = r'$^') -> None:
    """Load our state dict ``ours`` into ``peer`` through ``to_ours`` (the core conversion of the
    peer's layout into ours) run backwards: ``to_ours`` is applied to a probe holding each
    peer element's own index (float64, exact), so every element of ours says which peer element
    it is. Renames, q/k/v joins and the PatchMerging channel reorder are inverted exactly.
    Raises ValueError for a weight of ours the peer has no place for, or a peer parameter left
    unfilled whose name does not match ``unfilled`` (weights the peer has but never applies)."""
    from mmvitswin.core.checkpoint import DERIVED_KEYS
    own = peer.state_dict()
    probe, spans, total = {}, {}, 0
    for key, value in own.items():
        if value.is_floating_point():
            probe[key] = torch.arange(total, total + value.numel(),
                                      dtype=torch.float64).reshape(value.shape)
            spans[key], total = (total, value.numel()), total + value.numel()
    values = torch.full((total, ), float('nan'), dtype=torch.float64)
    used = set()
    for key, index in to_ours(probe).items():
        if not (torch.is_tensor(index) and index.dtype == torch.float64):
            continue  # derived on our side (relative_position_index)
        if key not in ours or tuple(ours[key].shape) != tuple(index.shape):
            raise ValueError(f'{key}: the peer has it with shape {tuple(index.shape)}, ours '
                             + (f'has {tuple(ours[key].shape)}' if key in ours else 'does not'))
        values[index.reshape(-1).long()] = ours[key].detach().to('cpu', torch.float64).reshape(-1)
        used.add(key)
    left = [k for k, v in ours.items() if k not in used and v.is_floating_point()
            and not k.endswith(DERIVED_KEYS)]
    params = dict(peer.named_parameters())
    unset = [k for k, (start, n) in spans.items() if torch.isnan(values[start:start + n]).any()]
    bad = [k for k in unset if k in params and not re.match(unfilled, k)]
    if left or bad:
        raise ValueError(f'weights of ours without a place in the peer: {left[:4]}; peer '
                         f'parameters left unset: {bad[:4]}')
    peer.load_state_dict({k: values[s:s + n].reshape(own[k].shape).to(own[k].dtype)
                          for k, (s, n) in spans.items() if k not in unset}, strict=False)


def _timm_to_ours(sd: dict) -> dict:
    from mmvitswin.core.checkpoint import convert_swin_state_dict
    # features_only flattens 'layers.N' into 'layers_N'; the rest is timm's own layout
    return convert_swin_state_dict({re.sub(r'^layers_(\d+)\.', r'layers.\1.', k): v
                                    for k, v in sd.items()})[0]


def timm_swin(cfg: dict, state: dict, img_size: int = 224) -> nn.Module:
    """timm's Swin (``TIMM_SWIN``, ``features_only=True, strict_img_size=False``) with ``cfg``'s
    architecture and our weights ``state``. Its features are NHWC and not normalised (ours:
    ``norm{i}`` on each level, left out here), and it drops the shift in stages no larger than
    the window at ``img_size`` (Swin-T at 224: stage 4)."""
    timm, note = import_timm()
    if timm is None:
        raise RuntimeError(note)
    kw = swin_kwargs(cfg, state)
    model = timm.create_model(
        TIMM_SWIN, pretrained=False, features_only=True, strict_img_size=False,
        img_size=img_size, patch_size=kw['patch_size'], in_chans=kw['in_channels'],
        embed_dim=kw['embed_dims'], depths=tuple(kw['depths']), num_heads=tuple(kw['num_heads']),
        window_size=kw['window_size'], mlp_ratio=kw['mlp_ratio'], qkv_bias=kw['qkv_bias'],
        drop_rate=kw['drop_rate'], attn_drop_rate=kw['attn_drop_rate'],
        drop_path_rate=kw['drop_path_rate'])
    load_from_ours(model, {k: v for k, v in state.items() if not re.match(r'norm\d+\.', k)},
                   _timm_to_ours)
    return model


class HFFeatureMaps(nn.Module):
    """HF ``SwinBackbone`` returning its feature maps (NCHW, each normalised), like mmdet's."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.backbone(pixel_values=x).feature_maps)


def hf_swin(cfg: dict, state: dict) -> nn.Module:
    """HF ``transformers``' ``SwinBackbone`` (all stages out) with ``cfg``'s architecture and
    our weights ``state`` (its final ``layernorm``, never applied by the backbone, kept)."""
    from transformers import SwinBackbone, SwinConfig

    from mmvitswin.core.checkpoint import convert_swin_state_dict
    kw = swin_kwargs(cfg, state)
    config = SwinConfig(
        image_size=kw['pretrain_img_size'], patch_size=kw['patch_size'],
        num_channels=kw['in_channels'], embed_dim=kw['embed_dims'], depths=list(kw['depths']),
        num_heads=list(kw['num_heads']), window_size=kw['window_size'],
        mlp_ratio=kw['mlp_ratio'], qkv_bias=kw['qkv_bias'], hidden_dropout_prob=kw['drop_rate'],
        attention_probs_dropout_prob=kw['attn_drop_rate'], drop_path_rate=kw['drop_path_rate'],
        out_features=[f'stage{i + 1}' for i in range(len(kw['depths']))])
    model = HFFeatureMaps(SwinBackbone(config))
    load_from_ours(model.backbone, state, lambda sd: convert_swin_state_dict(sd)[0],
                   unfilled=r'(swin\.)?layernorm\.')
    return model


PEER_BUILDERS = dict(timm=timm_swin, hf=hf_swin)


def build_peer(subject, name: str) -> Optional[nn.Module]:
    """Variant ``name`` ('timm fp32', 'hf bf16', ...) of a backbone case's ``subject``: the
    peer with our weights, on the case's device and in its mode; None if it cannot be built
    (the reason in ``subject.peer_errors[name]``, the case goes on without it)."""
    impl, *flags = name.split()
    try:
        if getattr(subject, 'reference', None):  # the case's baseline is HF's own model
            raise ValueError(f"the peers are V1 Swins; this case's reference is "
                             f"{subject.reference!r}: profile it as 'ref'")
        model = PEER_BUILDERS[impl](subject.backbone_cfg, subject.state)
    except Exception as exc:  # noqa: BLE001  (timm missing, an architecture it lacks)
        reason = f'{type(exc).__name__}: {exc}'.splitlines()[0][:300]
        subject.__dict__.setdefault('peer_errors', {})[name] = reason
        print(f'[bench] {name} not built: {reason}', file=sys.stderr, flush=True)
        return None
    model.to(subject.device)
    model.train(subject.case['kind'] in ('train', 'rss_train'))
    if 'compiled' in flags or subject.args.compile:
        compile_blocks(model)
    return model


def case_roofline(case: dict, subject, sizes, args, device, rows) -> Optional[dict]:
    """:func:`roofline` for a forward or train-step case with time rows (``--no-roofline``:
    None); a failure is recorded as ``{'error': ...}``, the times stand."""
    if not args.roofline or case['kind'] not in ('forward', 'train') or \
            not any(r['metric'] == 'time' for r in rows):
        return None
    dtypes = {n.split()[1] for r in rows for n in (r['subject'], r['baseline'],
                                                   *r.get('peers', ())) if n}
    try:
        return roofline(case, subject, sizes, args, device, sorted(dtypes))
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        return dict(error=f'{type(exc).__name__}: {exc}'.splitlines()[0][:200])


def summarize_more(row: dict, record: dict, subject) -> dict:
    """The peers' and the roofline's fields of a summarised time row."""
    if row['metric'] != 'time':
        return {}
    out = summarize_peers(row, record['variants'], getattr(subject, 'peer_errors', {})) \
        if row.get('peers') else {}
    out.update(summarize_roofline(row, record['variants'], record.get('roofline')))
    return out


def peer_notes() -> List[str]:
    """What the peers' columns are, for the report."""
    try:
        import transformers
    except ImportError as exc:
        hf = f'HF transformers not benchmarked: {type(exc).__name__}: {exc}'
    else:
        hf = (f'HF transformers {transformers.__version__} SwinBackbone (all four stages, '
              'attention implementation as configured by default)')
    return [import_timm()[1] + f": '{TIMM_SWIN}', features_only=True, strict_img_size=False: "
            'NHWC features without the per-level norms, no shift in stages no larger than the '
            'window at 224 (Swin-T: stage 4), rolls before padding', hf]


def add_peers(rows: List[dict], case: dict, args) -> None:
    """Give each time row of a Swin backbone case whose baseline is the reference the peers
    (``row['peers']``: 'timm <dtype>', 'hf <dtype>', the baseline's precision)."""
    cfg = BACKBONES.get(case['model'], {})
    if not args.peers or case['kind'] not in ('forward', 'train') or \
            str(cfg.get('type', '')).split('.')[-1] != 'SwinTransformer':
        return
    for row in rows:
        found = re.fullmatch(r'ref (\w+)', row['baseline'] or '')
        if row['metric'] == 'time' and found:
            row['peers'] = [f'{p} {found.group(1)}' for p in args.peers]


def _mean_ms(times) -> Optional[float]:
    return 1e3 * sum(times) / len(times) if times else None


def summarize_peers(row: dict, variants: dict, errors: dict) -> dict:
    """``{impl}_{phase}_ms`` and ``{impl}_{phase}_speedup`` (peer time / subject time) for each
    peer, ``{impl}_error`` for one not built, and ``fastest_{phase}_speedup``: the fastest of
    the baseline and the peers over the subject (> 1: the subject beats all of them)."""
    out, s = {}, variants.get(row['subject'], {})
    for phase in ('first', 'again'):
        others = [variants.get(row['baseline'], {}).get(phase)]
        for name in row.get('peers', ()):
            impl, v = name.split()[0], variants.get(name)
            if v is None or 'error' in v:
                out[f'{impl}_error'] = (v or {}).get('error') or errors.get(name, 'not built')
                continue
            out[f'{impl}_{phase}_ms'] = _mean_ms(v[phase])
            out[f'{impl}_{phase}_speedup'] = (sum(v[phase]) / sum(s[phase])
                                              if v[phase] and s.get(phase) else None)
            others.append(v[phase])
        best = min((sum(t) / len(t) for t in others if t), default=None)
        out[f'fastest_{phase}_speedup'] = (best * len(s[phase]) / sum(s[phase])
                                           if best and s.get(phase) else None)
    return out


# ------------------------------------------------------------------------------ GEMM roofline
# A row's FLOPs are the matrix products of one call of our fp32 model (torch's FlopCounterMode:
# linears, attention, convolutions; forward, plus backward in a train step) at each of its
# sizes; its limit is this machine's torch.mm rate (the threads in use) at the model's own
# GEMM shapes, recorded at the pass's median size, in the variant's precision.
_GEMM_SECONDS: dict = {}  # (M, K, N, a transposed, b transposed, dtype, device) -> best seconds


def _transposed(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.size(0) > 1 and t.size(1) > 1 and t.stride(0) == 1


def _gemm_shapes_mode():
    """A dispatch mode counting the GEMMs a call runs: ``counts[(M, K, N, a_t, b_t)]``, from
    ``mm``/``addmm`` and from convolutions (forward and both gradients) read as GEMMs."""
    from torch.utils._python_dispatch import TorchDispatchMode
    aten = torch.ops.aten

    class GemmShapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts = {}

        def _add(self, m, k, n, a_t=False, b_t=False):
            key = (int(m), int(k), int(n), a_t, b_t)
            self.counts[key] = self.counts.get(key, 0) + 1

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            packet = getattr(func, 'overloadpacket', None)
            if packet in (aten.mm, aten.addmm):
                a, b = args[-2:] if packet is aten.addmm else args[:2]
                self._add(a.size(0), a.size(1), b.size(1), _transposed(a), _transposed(b))
            elif packet is aten.convolution and args[1].dim() == 4 and args[8] == 1 and (
                    not args[6] or args[1].shape[2:].numel() == 1):
                w, o = args[1], out
                k = w.size(1) * w.shape[2:].numel() if not args[6] else w.size(0)
                self._add(o.size(0) * o.shape[2:].numel(), k, o.size(1))
            elif packet is aten.convolution_backward and args[2].dim() == 4 and args[9] == 1 \
                    and not args[7]:
                g, w, mask = args[0], args[2], args[10]
                m, k, n = g.size(0) * g.shape[2:].numel(), w.size(1) * w.shape[2:].numel(), \
                    w.size(0)
                if mask[0]:
                    self._add(m, n, k)
                if mask[1]:
                    self._add(n, m, k, a_t=True)
            return out

    return GemmShapes()


def _sdpa_flops():
    """FlopCounterMode formulas for the CPU's fused attention ops, which torch's table lacks
    (torch's own SDPA formulas, so counts match the GPU ops')."""
    from torch.utils import flop_counter as fc
    aten, table = torch.ops.aten, {}
    fwd = getattr(aten, '_scaled_dot_product_flash_attention_for_cpu', None)
    bwd = getattr(aten, '_scaled_dot_product_flash_attention_for_cpu_backward', None)
    if fwd is not None and hasattr(fc, 'sdpa_flop_count'):
        table[fwd] = lambda q, k, v, *a, out_shape=None, **kw: fc.sdpa_flop_count(q, k, v)
    if bwd is not None and hasattr(fc, 'sdpa_backward_flop_count'):
        table[bwd] = lambda g, q, k, v, *a, out_shape=None, **kw: \
            fc.sdpa_backward_flop_count(g, q, k, v)
    return table


def count_flops(model: nn.Module, x: torch.Tensor, train: bool, shapes=None) -> int:
    """Matrix-product FLOPs of one forward (``train``: forward, loss, backward) of ``model``
    on ``x``; ``shapes``: a :func:`_gemm_shapes_mode` to record the GEMMs too."""
    from contextlib import nullcontext
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False, custom_mapping=_sdpa_flops()) as counter:
        with shapes or nullcontext():
            if train:
                sum(o.float().square().mean() for o in _levels(model(x))).backward()
            else:
                with torch.no_grad():
                    model(x)
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def gemm_seconds(m: int, k: int, n: int, a_t: bool, b_t: bool, dtype, device,
                 reps: int = 5) -> Tuple[float, float]:
    """(median, best) of ``reps`` timed ``torch.mm`` of (m, k) @ (k, n) in ``dtype`` (operands
    laid out transposed where the model's were), after one warm-up; cached per process. The
    median is the limit the rows are held to: on a quiet machine it is the best, on a shared
    one it is what the machine gives while the rows run (the best then flatters it)."""
    key = (m, k, n, a_t, b_t, dtype, str(device))
    if key not in _GEMM_SECONDS:
        a = (torch.randn(k, m, device=device).t() if a_t else
             torch.randn(m, k, device=device)).to(dtype)
        b = (torch.randn(n, k, device=device).t() if b_t else
             torch.randn(k, n, device=device)).to(dtype)
        times = []
        for i in range(reps + 1):
            sync(device)
            start = time.perf_counter()
            torch.mm(a, b)
            sync(device)
            if i:
                times.append(time.perf_counter() - start)
        times.sort()
        _GEMM_SECONDS[key] = (times[len(times) // 2], times[0])
    return _GEMM_SECONDS[key]


def gemm_rate(counts: dict, dtype, device, best: bool = False) -> Optional[float]:
    """GFLOP/s of torch.mm over the GEMM shapes ``counts`` (each weighted by its count), from
    the median times (``best``: the best ones)."""
    flops = sum(2 * m * k * n * c for (m, k, n, _, _), c in counts.items())
    seconds = sum(gemm_seconds(*shape, dtype, device)[best] * c for shape, c in counts.items())
    return flops / seconds / 1e9 if seconds else None


def roofline(case: dict, subject, sizes, args, device, dtypes) -> dict:
    """FLOPs of each pass size (``flops``, in order) and the GEMM rate per precision
    (``gemm_gflops``), measured after the passes."""
    model = subject.variant('ours fp32')
    train = case['kind'] == 'train'
    model.train(train)
    by_area = sorted(sizes[1:], key=lambda s: s[0] * s[1])
    median = by_area[len(by_area) // 2]
    shapes, flops = _gemm_shapes_mode(), []
    for i, size in enumerate(sizes[1:], 1):
        x = subject.make_input(size, i)
        flops.append(count_flops(model, x, train, shapes if size == median else None))
    del model
    return dict(flops=flops, gemm_size=median, gemm_shapes=len(shapes.counts),
                threads=torch.get_num_threads(),
                gemm_gflops={d: gemm_rate(shapes.counts, DTYPES[d], device) for d in dtypes},
                gemm_gflops_best={d: gemm_rate(shapes.counts, DTYPES[d], device, best=True)
                                  for d in dtypes})


def summarize_roofline(row: dict, variants: dict, roof: Optional[dict]) -> dict:
    """``gflop_per_call``, ``roof_gflops`` (the subject's precision) and, per phase, the
    achieved GFLOP/s of the subject and ``{phase}_roof_ratio`` = achieved / roof; the same
    ratio for the baseline (``baseline_{phase}_roof_ratio``) and each peer."""
    if not roof or 'error' in roof:
        return {}
    flops = roof['flops']
    out = dict(gflop_per_call=sum(flops) / len(flops) / 1e9,
               roof_gflops=roof['gemm_gflops'].get(row['subject'].split()[1]))
    who = [('', row['subject']), ('baseline_', row['baseline'])] + [
        (f"{p.split()[0]}_", p) for p in row.get('peers', ())]
    for prefix, name in who:
        v = variants.get(name) if name else None
        rate = roof['gemm_gflops'].get(name.split()[1]) if name else None
        for phase in ('first', 'again'):
            times = (v or {}).get(phase)
            if not times or len(times) != len(flops) or not rate:
                continue
            achieved = sum(flops) / sum(times) / 1e9
            if not prefix:
                out[f'{phase}_gflops'] = achieved
            out[f'{prefix}{phase}_roof_ratio'] = achieved / rate
    return out


# ------------------------------------------------------------------------------ profile mode
# (group, exact op names, name fragments): an op goes to the first group that names it or a
# fragment of its name; 'other' takes the rest. Times are the ops' self times.
PROFILE_GROUPS = (
    ('attention (SDPA)', (), ('scaled_dot_product', 'flash_attention', 'efficient_attention')),
    ('softmax', (), ('softmax', )),
    ('GEMM', ('mm', 'addmm', 'bmm', 'baddbmm', 'addbmm', 'matmul', 'linear', 'mv', 'addmv',
              'dot', 'einsum', '_linear_pointwise', 'linear_backward'), ('conv', 'mkldnn_linear')),
    ('norms', (), ('layer_norm', 'group_norm', 'batch_norm', 'rms_norm')),
    ('GELU', (), ('gelu', )),
    ('layout copies', ('copy_', 'contiguous', 'clone', 'permute', 'transpose', 't', 'roll',
                       'index_select', 'cat', 'pad', 'constant_pad_nd', '_to_copy', 'to',
                       'reshape', 'view', '_unsafe_view', '_reshape_alias', 'expand',
                       'as_strided', 'narrow', 'narrow_copy', 'slice', 'select', 'split',
                       'split_with_sizes', 'chunk', 'unbind', 'stack', 'unfold', 'im2col',
                       'col2im', 'flatten', 'unflatten', 'unsqueeze', 'squeeze', 'movedim',
                       'slice_backward', 'select_backward', 'alias', 'pixel_shuffle',
                       'pixel_unshuffle', 'reflection_pad2d', 'replication_pad2d'), ()),
    ('gather/scatter', ('index', 'index_put', 'index_put_', '_index_put_impl_', 'gather',
                        'scatter', 'scatter_', 'scatter_add', 'scatter_add_', 'index_add',
                        'index_add_', 'index_copy_', 'index_fill_', 'take', 'embedding',
                        'embedding_dense_backward', 'masked_scatter'), ()),
    ('optimizer', (), ('_fused_adam', '_foreach_', 'Optimizer.')),
)
PROFILE_ORDER = [g for g, _, _ in PROFILE_GROUPS] + ['other']


def op_group(name: str) -> str:
    """The :data:`PROFILE_GROUPS` group of a profiler event name (``aten::mm`` -> 'GEMM')."""
    base = name.split('::')[-1].split('.')[0]
    for group, names, fragments in PROFILE_GROUPS:
        if base in names or any(f in name for f in fragments):
            return group
    return 'other'


def group_profile(events, calls: int, cuda: bool) -> Tuple[dict, List[tuple]]:
    """ms per call of each group (the self times of profiler ``events``, e.g.
    ``prof.events()``; every op run inside an ``Optimizer.step`` counts as 'optimizer'), and the
    ops by time: (name, group, ms)."""
    groups, ops = dict.fromkeys(PROFILE_ORDER, 0.0), {}
    for e in events:
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us <= 0:
            continue
        parent, group = e.cpu_parent, op_group(e.name)
        while parent is not None and group != 'optimizer':
            if parent.name.startswith('Optimizer.step'):
                group = 'optimizer'
            parent = parent.cpu_parent
        ms = us / 1e3 / calls
        groups[group] += ms
        ops[(e.name, group)] = ops.get((e.name, group), 0.0) + ms
    return groups, sorted(((n, g, ms) for (n, g), ms in ops.items()), key=lambda o: -o[2])


def profile_workloads(args, device) -> List[dict]:
    """torch.profiler over ``args.count`` new sizes (after a warm-up size) of each profiled
    implementation, kind (forward, train step) and precision (fp32, ``args.dtype``)."""
    from torch.profiler import ProfilerActivity, profile
    sizes = draw_sizes((args.count or 2) + 1, args.profile_scale, args.seed)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda'
                                           else [])
    out = []
    for kind in ('forward', 'train'):
        case = dict(model=args.profile_model, kind=kind, scale=args.profile_scale,
                    batch=args.profile_batch)
        subject = Subject(case, args, device)
        inputs = [subject.make_input(s, i) for i, s in enumerate(sizes)]
        for impl in args.profile_impls:
            for dtype in dict.fromkeys(('fp32', args.dtype)):
                name = f'{impl} {dtype}'
                entry = dict(impl=impl, kind=kind, dtype=dtype, sizes=sizes)
                try:
                    model = subject.variant(name)
                    if model is None:
                        raise RuntimeError(subject.peer_errors.get(name) or 'no such variant')
                    call = make_call(kind, model, dtype, device)
                    call(inputs[0])
                    with profile(activities=activities) as prof:
                        start = time.perf_counter()
                        for x in inputs[1:]:
                            call(x)
                        sync(device)
                        wall = time.perf_counter() - start
                    groups, ops = group_profile(prof.events(), len(inputs) - 1,
                                                device.type == 'cuda')
                    entry.update(wall_ms=1e3 * wall / (len(inputs) - 1), groups=groups,
                                 top_ops=ops[:15])
                except Exception as exc:  # noqa: BLE001  (one workload must not lose the rest)
                    traceback.print_exc()
                    entry['error'] = f'{type(exc).__name__}: {exc}'.splitlines()[0][:200]
                out.append(entry)
                print(f"[profile] {kind} {name}: " + (entry.get('error') or
                      f"{entry['wall_ms']:.1f} ms per call"), file=sys.stderr, flush=True)
    return out


def render_profile(report: dict) -> str:
    from tabulate import tabulate
    m, work = report['machine'], report['workloads']
    ok = [w for w in work if 'error' not in w]
    heads = [f"{w['impl']} {w['kind'].replace('train', 'train step')} {w['dtype']}" for w in ok]
    def cell(w, group):
        total = max(sum(w['groups'].values()), 1e-9)
        return f"{w['groups'][group]:.1f} ({100 * w['groups'][group] / total:.0f} %)"
    table = [[group] + [cell(w, group) for w in ok] for group in PROFILE_ORDER]
    table.append(['sum of op self times'] + [f"{sum(w['groups'].values()):.1f}" for w in ok])
    table.append(['wall per call'] + [f"{w['wall_ms']:.1f}" for w in ok])
    sizes = ok[0]['sizes'] if ok else []
    lines = [f"# mmvitswin profile: {report['model']}", '',
             f"{m['cpu']}, {m['cpus']} usable CPUs, {m['threads']} torch threads, device "
             f"{m['device']}; torch {m['torch']}; commit {m.get('commit')}; load average "
             f"{m['load_average'][0]:.1f} at start, {report['load_average_end'][0]:.1f} at "
             f"end. ms per call (self time of the ops in each group, % of their sum), mean "
             f"over {len(sizes) - 1} new sizes after a warm-up at another; batch "
             f"{report['batch']}; train step = forward, loss, backward, AdamW.", '',
             tabulate(table, ['group'] + heads, tablefmt='github', disable_numparse=True), '',
             '- sizes (warm-up first): ' + ', '.join(f'{h}x{w}' for h, w in sizes)]
    for w in ok:
        lines.append(f"- top ops, {w['impl']} {w['kind']} {w['dtype']}: " + ', '.join(
            f"{n.split('::')[-1]} {ms:.1f}" for n, _, ms in w['top_ops'][:8]))
    for w in work:
        if 'error' in w:
            lines.append(f"- error in {w['impl']} {w['kind']} {w['dtype']}: {w['error']}")
    return '\n'.join(lines) + '\n'


def profile_main(args, device) -> int:
    """``--profile``: the grouped op profile (``profile.md``, ``profile.json`` in --out-dir)."""
    report = dict(model=args.profile_model, batch=args.profile_batch, settings=vars(args),
                  machine=machine_info(device))
    report['workloads'] = profile_workloads(args, device)
    report['load_average_end'] = list(os.getloadavg())
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, 'profile.json'), 'w') as f:
        json.dump(report, f, indent=1, default=str)
    text = render_profile(report)
    with open(os.path.join(args.out_dir, 'profile.md'), 'w') as f:
        f.write(text)
    print(text)
    return 1 if any('error' in w for w in report['workloads']) else 0


# ------------------------------------------------------------------------------ peer, roof tables
def render_peers(rows: List[dict], cases: List[dict]) -> List[str]:
    """The peers table (each Swin time row against mmdet, timm and HF) and its notes."""
    from tabulate import tabulate
    rows = [r for r in rows if r.get('peers') and 'error' not in r]
    if not rows:
        return []
    table = []
    for r in rows:
        cells = _names(r)[:2]
        for phase in ('first', 'again'):
            cells += [_f(r.get(f'{phase}_ms')), _f(r.get(f'{phase}_ms_baseline'))]
            cells += [_f(r.get(f'{impl}_{phase}_ms')) if f'{impl}_error' not in r else 'n/a'
                      for impl in PEERS]
            cells.append(_f(r.get(f'fastest_{phase}_speedup'), 2))
        table.append(cells)
    head = ['row', 'subject']
    for phase in ('new', 'seen'):
        head += [f'{phase}: subj ms', f'{phase}: {rows[0].get("reference") or "ref"} ms',
                 f'{phase}: timm ms', f'{phase}: HF ms', f'{phase}: vs fastest']
    notes = [f'- {n}' for n in peer_notes()]
    errors = {f"{impl}: {r[f'{impl}_error']}" for r in rows for impl in PEERS
              if f'{impl}_error' in r}
    notes += [f'- not built: {e}' for e in sorted(errors)]
    return ['## Peers (same weights, interleaved; peers in the baseline\'s precision)', '',
            'vs fastest = the fastest of the baseline and the peers / subject (> 1: the subject '
            'beats every one).', '', tabulate(table, head, tablefmt='github',
                                                disable_numparse=True), ''] + notes + ['']


def render_roofline(rows: List[dict], cases: List[dict]) -> List[str]:
    """The roofline table: each time row's FLOPs, the GEMM limit and the fraction reached."""
    from tabulate import tabulate
    rows = [r for r in rows if r.get('gflop_per_call')]
    if not rows:
        return []
    table = [[_names(r)[0], _f(r['gflop_per_call']), _f(r.get('roof_gflops'), 0),
              _f(r.get('first_gflops'), 0)] + [
        _f(100 * r[k], 0) if r.get(k) else '-' for k in
        ('first_roof_ratio', 'baseline_first_roof_ratio', 'timm_first_roof_ratio',
         'hf_first_roof_ratio', 'again_roof_ratio')] for r in rows]
    gemm = {(c['case']['model'], c['case']['kind']): c['roofline'] for c in cases
            if c.get('roofline') and 'error' not in c['roofline']}
    notes = [f"- {model} {kind}: GEMM rate at {len(r['flops'])} sizes' FLOPs, {r['gemm_shapes']} "
             f"distinct GEMM shapes recorded at {r['gemm_size'][0]}x{r['gemm_size'][1]}, "
             f"{r['threads']} threads, median (best) of 5: " + ', '.join(
                 f"{d} {_f(g, 0)} ({_f(r.get('gemm_gflops_best', {}).get(d), 0)}) GFLOP/s"
                 for d, g in r['gemm_gflops'].items())
             for (model, kind), r in gemm.items()]
    return ['## GEMM roofline', '',
            "FLOPs: matrix products (linears, attention, convolutions) of one call of our fp32 "
            'model, forward (train rows: + backward), counted by torch FlopCounterMode; roof: '
            "torch.mm's GFLOP/s on this machine (median of 5) at the model's own GEMM shapes, "
            "in the subject's precision; % of roof = FLOPs / time / roof (new-sizes pass; seen: the "
            'second pass).', '',
            tabulate(table, ['row', 'GFLOP per call', 'roof GFLOP/s', 'new: subj GFLOP/s',
                             'new: subj % of roof', 'new: base %', 'new: timm %', 'new: HF %',
                             'seen: subj %'], tablefmt='github', disable_numparse=True), ''] \
        + notes + ['']


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
    cache = (f"; oneDNN primitive cache {m['onednn_primitive_cache']}"
             if m.get('onednn_primitive_cache') else '')
    lines = [f"# mmvitswin benchmark ({report['preset']})", '',
             f"{m['cpu']}, {m['cpus']} usable CPUs, {m['threads']} torch threads, "
             f"device {m['device']}{', ' + m['gpu'] if m.get('gpu') else ''}"
             f"{'; torch CPU capability ' + m['cpu_capability'] if m.get('cpu_capability') else ''}"
             f"; fast path {m.get('fast_path', '?')}{cache}; torch {m['torch']}, "
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
    lines += render_peers(rows, report['cases']) + render_roofline(rows, report['cases'])
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
    p.add_argument('--peers', nargs='*', default=list(PEERS), choices=PEERS,
                   help='Swin peers timed beside the reference (default: timm hf; none: --peers)')
    p.add_argument('--no-roofline', dest='roofline', action='store_false',
                   help='leave out the FLOP count and GEMM-rate measurement')
    p.add_argument('--profile', action='store_true',
                   help='instead of the cases: torch.profiler op groups of forward and train '
                        'step, fp32 and --dtype (profile.md, profile.json)')
    p.add_argument('--profile-model', default='swin_t', choices=sorted(BACKBONES))
    p.add_argument('--profile-impls', nargs='+', default=['ours'],
                   choices=['ours', 'ref', *PEERS])
    p.add_argument('--profile-scale', type=float, default=1.0,
                   help='of the recipe sizes (1.0: detection sizes); --count sets how many')
    p.add_argument('--profile-batch', type=int, default=1)
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
    if args.profile:
        return profile_main(args, device)
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

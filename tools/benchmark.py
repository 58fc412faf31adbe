#!/usr/bin/env python
"""Speed and memory of mmvitswin backbones and whole models against mmdet's/mmseg's own.

Ours and the reference get the same weights and the same input and run in the same process,
interleaved (ours, ref, ref, ours, ...) so that a busy or throttling machine slows both alike.
Each measurement is the median of ``--runs`` runs after ``--warmup`` warm-up runs; one extra
untimed run per model measures peak memory (see :mod:`mmvitswin.benchmark`). Ratios:
``speedup = ref_time / our_time`` (> 1: we are faster), ``mem_ratio = our_peak / ref_peak``.

Examples::

    # what `make bench` runs (< 10 min on 2 CPU cores)
    python tools/benchmark.py --preset standard --out-dir bench_out
    # a backbone by registered name, a JSON dict or a config file (its model.backbone)
    python tools/benchmark.py --backbone SwinTransformer \\
        --backbone-kwargs '{"depths": [2, 2, 18, 2]}' --forward 224:8 800x1344:1 \\
        --train 512:2 --with-cp --sweep 224 512 800
    python tools/benchmark.py --backbone configs/some_detector.py --forward 512:2
    # whole models: an alias (maskrcnn, upernet) or an mmdet/mmseg config path, =HxW:BATCH
    python tools/benchmark.py --whole maskrcnn=512x512:1 upernet=512x512:2
    # on a GPU
    python tools/benchmark.py --preset standard --device cuda --dtype bf16 --out-dir bench_cuda

Outputs in ``--out-dir``: ``benchmark.json`` (machine, settings, every raw time, medians,
ratios, parity checks), ``benchmark.md`` (the tables, also printed) and ``forward_vs_size.png``.
"""
import argparse
import copy
import inspect
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from mmvitswin.benchmark import (autocast_context, count_flops, gemm_peak,  # noqa: E402
                                 machine_info, measure_peak_memory, parse_dtype, summarize,
                                 time_call)

Size = Tuple[int, int]
VARIANTS = ('ours', 'ref')
MIB = 2**20

# whole-model aliases: (host package, config path under <host>/.mim/configs)
WHOLE_ALIASES = {
    'maskrcnn': ('mmdet', 'swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'),
    'upernet': ('mmseg',
                'swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'),
}

# Presets fill every option the command line leaves unset.
PRESETS = {
    'standard': dict(
        backbone='SwinTransformer', forward=['224:8', '800x1344:1'], train=['512:2'],
        with_cp=True, sweep=['224', '320', '512', '640', '800'], sweep_batch=1,
        whole=['maskrcnn=512x512:1', 'upernet=256x256:2'], runs=3, warmup=1,
        cp_runs=2, whole_runs=2, whole_warmup=1, threads='auto'),
    # a one-minute smoke run of every code path
    'quick': dict(
        backbone='SwinTransformer', backbone_kwargs='{"depths": [1, 1, 1, 1]}',
        forward=['96:2'], train=['96:1'], with_cp=True, sweep=['64', '96'], sweep_batch=1,
        whole=[], runs=1, warmup=0),
}
DEFAULTS = dict(backbone='SwinTransformer', backbone_kwargs='{}', forward=[], train=[],
                with_cp=False, sweep=[], sweep_batch=1, whole=[], runs=3, warmup=1,
                cp_runs=None, whole_runs=None, whole_warmup=None, threads=None)

# issue 8's goals, checked when the matching case was measured (fp32 only).
# (label, case key, metric, comparison, goal)
TARGETS = [
    ('forward 224x224 b8 speed-up',
     ('backbone', 'forward', (224, 224), 8, False), 'speedup', '>=', 1.5),
    ('forward 800x1344 b1 speed-up',
     ('backbone', 'forward', (800, 1344), 1, False), 'speedup', '>=', 1.5),
    ('train 512x512 b2 speed-up',
     ('backbone', 'train', (512, 512), 2, False), 'speedup', '>=', 1.3),
    ('train 512x512 b2 peak RSS ours/ref',
     ('backbone', 'train', (512, 512), 2, False), 'mem_ratio', '<=', 0.8),
    ('with_cp peak / without (ours, 512x512 b2)',
     ('backbone', 'train', (512, 512), 2, True), 'cp_mem_ratio', '<=', 0.5),
    ('forward 224x224 b8 % of GEMM peak',
     ('backbone', 'forward', (224, 224), 8, False), 'pct_gemm_peak', '>=', 60.0),
    ('forward 800x1344 b1 % of GEMM peak',
     ('backbone', 'forward', (800, 1344), 1, False), 'pct_gemm_peak', '>=', 60.0),
]


# ------------------------------------------------------------------------------ parsing
def parse_size(text: str) -> Size:
    """'224' -> (224, 224); '800x1344' -> (800, 1344) (height x width)."""
    parts = str(text).lower().split('x')
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f'size must be S or HxW with positive integers, got {text!r}') from None
    if len(dims) == 1:
        dims = dims * 2
    if len(dims) != 2 or min(dims) < 1:
        raise ValueError(f'size must be S or HxW with positive integers, got {text!r}')
    return dims[0], dims[1]


def parse_case(text: str, default_batch: int = 1) -> Tuple[Size, int]:
    """'HxW:B' | 'S:B' | 'S' -> ((H, W), B)."""
    size, _, batch = str(text).partition(':')
    try:
        b = int(batch) if batch else default_batch
    except ValueError:
        raise ValueError(f'case must be SIZE[:BATCH], got {text!r}') from None
    if b < 1:
        raise ValueError(f'batch must be >= 1, got {text!r}')
    return parse_size(size), b


def parse_whole(text: str) -> Tuple[str, str, Size, int]:
    """'ALIAS_OR_CONFIG=HxW:B' -> (label, config path, (H, W), B); size defaults to 512:1."""
    name, _, case = str(text).partition('=')
    (hw, batch) = parse_case(case or '512:1')
    if name in WHOLE_ALIASES:
        host, rel = WHOLE_ALIASES[name]
        path = os.path.join(os.path.dirname(__import__(host).__file__), '.mim', 'configs', rel)
        return name, path, hw, batch
    if not os.path.isfile(name):
        raise ValueError(f'whole model must be one of {sorted(WHOLE_ALIASES)} or an existing '
                         f'config file, got {name!r}')
    return os.path.splitext(os.path.basename(name))[0], name, hw, batch


def resolve_backbone_cfg(spec: str, overrides: dict) -> dict:
    """A registered type name, a JSON dict or a config file (its ``model.backbone``, else
    ``model``) -> a backbone config dict with ``overrides`` applied and no pretrained init."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f'backbone must be a type name, JSON dict or config path, got {spec!r}')
    if spec.lstrip().startswith('{'):
        cfg = json.loads(spec)
    elif os.path.isfile(spec):
        from mmengine.config import Config
        model = Config.fromfile(spec).get('model')
        if model is None:
            raise ValueError(f'config {spec!r} has no `model`')
        cfg = model.get('backbone', model)
        cfg = cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg)
    elif spec.endswith(('.py', '.json', '.yaml', '.yml')):
        raise ValueError(f'backbone config file {spec!r} does not exist')
    else:
        cfg = dict(type=spec)
    if not isinstance(cfg, dict) or 'type' not in cfg:
        raise ValueError(f'backbone config must be a dict with a "type", got {cfg!r}')
    cfg = copy.deepcopy(cfg)
    cfg.update(overrides)
    # random weights (seeded): no download, and ours and the reference get the same ones anyway
    cfg['init_cfg'] = None
    cfg.pop('pretrained', None)
    return cfg


def _type_name(cfg: dict) -> str:
    t = cfg['type']
    return (t if isinstance(t, str) else t.__name__).split('.')[-1]


def _describe(cfg: dict) -> str:
    extra = {k: v for k, v in cfg.items() if k not in ('type', 'init_cfg')}
    args = ', '.join(f'{k}={v}' for k, v in extra.items())
    return f'{_type_name(cfg)}({args})'


# ---------------------------------------------------------------------------- model pairs
def reference_swin_class(host: str):
    """The host's own Swin (the oracle), imported lazily: never needed by mmvitswin itself."""
    if host == 'mmdet':
        from mmdet.models.backbones.swin import SwinTransformer
    elif host == 'mmseg':
        from mmseg.models.backbones.swin import SwinTransformer
    else:
        raise ValueError(f"reference must be 'mmdet', 'mmseg' or 'none', got {host!r}")
    return SwinTransformer


def build_reference_backbone(host: str, cfg: dict, state: dict) -> Tuple[nn.Module, List[str]]:
    """The host's Swin built from the same kwargs (those it accepts), loaded with ``state``."""
    cls = reference_swin_class(host)
    kwargs = {k: v for k, v in cfg.items() if k != 'type'}
    accepted = inspect.signature(cls.__init__).parameters
    dropped = sorted(k for k in kwargs if k not in accepted)
    ref = cls(**{k: v for k, v in kwargs.items() if k in accepted})
    try:
        ref.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise RuntimeError(f'{host} SwinTransformer built from {kwargs} (dropped {dropped}) '
                           f'cannot take our weights: {exc}') from None
    return ref, dropped


def states_identical(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@dataclass
class Pair:
    """Ours and (optionally) the reference with identical weights; ``pristine`` restores them
    before each case so that earlier train steps do not leak into later measurements."""
    models: Dict[str, nn.Module]
    pristine: dict
    info: dict = field(default_factory=dict)

    def reset(self) -> None:
        for model in self.models.values():
            model.load_state_dict(self.pristine, strict=True)
            model.zero_grad(set_to_none=True)


def build_backbone_pair(cfg: dict, reference: str, device: torch.device, seed: int) -> Pair:
    from mmvitswin.registry import MODELS
    torch.manual_seed(seed)
    ours = MODELS.build(copy.deepcopy(cfg))
    state = {k: v.detach().clone() for k, v in ours.state_dict().items()}
    models = {'ours': ours}
    info = dict(config=cfg, description=_describe(cfg), reference=None)
    if reference != 'none':
        if _type_name(cfg) != 'SwinTransformer':
            print(f'[bench] no reference for {_type_name(cfg)}: measuring ours only',
                  file=sys.stderr)
        else:
            ref, dropped = build_reference_backbone(reference, cfg, state)
            models['ref'] = ref
            info.update(reference=f'{reference}.models.backbones.swin.SwinTransformer',
                        reference_dropped_kwargs=dropped,
                        weights_identical=states_identical(ours, ref))
    for m in models.values():
        m.to(device)
    info['parameters'] = sum(p.numel() for p in ours.parameters())
    return Pair(models, state, info)


def _to_bn(cfg):
    """SyncBN -> BN everywhere in a config (single process here)."""
    if isinstance(cfg, dict):
        return {k: ('BN' if k == 'type' and v == 'SyncBN' else _to_bn(v)) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return type(cfg)(_to_bn(v) for v in cfg)
    return cfg


def build_whole_pair(path: str, size: Size, overrides: dict, device: torch.device,
                     seed: int) -> Tuple[Pair, str, dict]:
    """Ours = the config as written (``SwinTransformer`` resolves to ours once mmvitswin is
    imported); ref = the same model with its backbone replaced by the host's own Swin built
    from the same kwargs. Returns the pair, the host ('mmdet'|'mmseg') and the model config."""
    from mmengine.config import Config, ConfigDict
    from mmengine.registry import DefaultScope
    from mmvitswin.models.backbones.swin import SwinTransformer as OurSwin
    cfg = Config.fromfile(path)
    host = cfg.get('default_scope', 'mmdet')
    if host not in ('mmdet', 'mmseg'):
        raise ValueError(f'{path}: default_scope must be mmdet or mmseg, got {host!r}')
    # host models read their sub-configs as attributes (train_cfg.rpn): keep a ConfigDict
    model_cfg = ConfigDict(_to_bn(cfg.model.to_dict()))
    model_cfg.pop('pretrained', None)
    model_cfg['backbone'].update(overrides)
    model_cfg['backbone']['init_cfg'] = None
    model_cfg['backbone'].pop('pretrained', None)
    if host == 'mmseg' and model_cfg.get('data_preprocessor', {}).get('size') is not None:
        # the preprocessor would pad to the training crop; measure the requested size instead
        model_cfg['data_preprocessor']['size'] = tuple(size)
    registry = (__import__('mmdet.registry', fromlist=['MODELS']) if host == 'mmdet' else
                __import__('mmseg.registry', fromlist=['MODELS'])).MODELS
    torch.manual_seed(seed)
    with DefaultScope.overwrite_default_scope(host):
        ours = registry.build(copy.deepcopy(model_cfg))
    if not isinstance(ours.backbone, OurSwin):
        raise RuntimeError(f'{path}: the backbone built as {type(ours.backbone)}, not '
                           "mmvitswin's SwinTransformer; is the registry bridge working?")
    ours.init_weights()
    ref = copy.deepcopy(ours)
    ref.backbone, dropped = build_reference_backbone(host, model_cfg['backbone'],
                                                     ours.backbone.state_dict())
    state = {k: v.detach().clone() for k, v in ours.state_dict().items()}
    for m in (ours, ref):
        m.to(device)
    info = dict(config=path, host=host, reference=f'{host}.models.backbones.swin.SwinTransformer',
                reference_dropped_kwargs=dropped, weights_identical=states_identical(ours, ref),
                parameters=sum(p.numel() for p in ours.parameters()))
    return Pair({'ours': ours, 'ref': ref}, state, info), host, model_cfg


# --------------------------------------------------------------------------- synthetic data
def _num_classes(model_cfg: dict, host: str) -> int:
    try:
        if host == 'mmdet':
            return int(model_cfg['roi_head']['bbox_head']['num_classes'])
        return int(model_cfg['decode_head']['num_classes'])
    except (KeyError, TypeError):
        return 2


def synthetic_det_batch(batch: int, size: Size, num_classes: int, seed: int,
                        boxes_per_image: int = 3) -> dict:
    """uint8 images with a few rectangular objects: boxes, labels and bitmap masks."""
    import numpy as np
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    gen = torch.Generator().manual_seed(seed)
    h, w = size
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8))
        lo = torch.rand(boxes_per_image, 2, generator=gen) * 0.6
        extent = 0.1 + torch.rand(boxes_per_image, 2, generator=gen) * 0.3
        scale = torch.tensor([w, h], dtype=torch.float32)
        xy1, xy2 = lo * scale, (lo + extent).clamp(max=1.0) * scale
        boxes = torch.cat([xy1, xy2], dim=1).floor()
        masks = np.zeros((boxes_per_image, h, w), dtype=np.uint8)
        for i, (x1, y1, x2, y2) in enumerate(boxes.long().tolist()):
            masks[i, y1:y2, x1:x2] = 1
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w),
                                             scale_factor=(1.0, 1.0), pad_shape=(h, w)))
        sample.gt_instances = InstanceData(
            bboxes=boxes, labels=torch.randint(0, num_classes, (boxes_per_image, ), generator=gen),
            masks=BitmapMasks(masks, h, w))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def synthetic_seg_batch(batch: int, size: Size, num_classes: int, seed: int) -> dict:
    """uint8 images with blocky random label maps (a few ignore=255 pixels)."""
    import torch.nn.functional as F
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    gen = torch.Generator().manual_seed(seed)
    h, w = size
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8))
        coarse = torch.randint(0, num_classes, (1, 1, max(1, h // 32), max(1, w // 32)),
                               generator=gen).float()
        seg = F.interpolate(coarse, size=(h, w), mode='nearest')[0].long()
        seg[:, :2, :] = 255
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w)))
        sample.gt_sem_seg = PixelData(data=seg)
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


# --------------------------------------------------------------------------- runnable steps
@dataclass
class Step:
    """One measured unit of work: ``prepare()`` (untimed) builds its input, ``call(payload)``
    (timed) does the work and returns something to compare (outputs or the loss)."""
    call: Callable[[object], object]
    prepare: Callable[[], object] = lambda: None


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05)


def _backward_and_step(loss, opt, scaler) -> None:
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    opt.zero_grad(set_to_none=True)


def _grad_scaler(device: torch.device, dtype_name: str):
    # fp16 gradients underflow without loss scaling; bf16/fp32 do not need it
    return torch.amp.GradScaler(device.type) if dtype_name == 'fp16' else None


def backbone_loss(outs) -> torch.Tensor:
    """A cheap scalar touching every pyramid level (mean of squares, in fp32)."""
    return sum(o.float().square().mean() for o in outs)


def forward_step(model: nn.Module, x: torch.Tensor, device, dtype_name) -> Step:
    def call(_):
        with torch.no_grad(), autocast_context(device, dtype_name):
            return model(x)
    return Step(call)


def backbone_train_step(model: nn.Module, x: torch.Tensor, device, dtype_name) -> Step:
    opt, scaler = _optimizer(model), _grad_scaler(device, dtype_name)

    def call(_):
        with autocast_context(device, dtype_name):
            loss = backbone_loss(model(x))
        _backward_and_step(loss, opt, scaler)
        return loss.detach()
    return Step(call)


def whole_train_step(model: nn.Module, batch: dict, device, dtype_name) -> Step:
    """data_preprocessor + loss + backward + AdamW step of an mmdet/mmseg model."""
    opt, scaler = _optimizer(model), _grad_scaler(device, dtype_name)

    def call(data):
        data = model.data_preprocessor(data, True)
        with autocast_context(device, dtype_name):
            losses = model(**data, mode='loss')
        loss, _ = model.parse_losses(losses)
        _backward_and_step(loss, opt, scaler)
        return loss.detach()
    return Step(call, prepare=lambda: copy.deepcopy(batch))


def max_abs_diff(a, b) -> float:
    """Largest |a - b| over matching tensors of two (nested) outputs."""
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape:
            return math.inf
        return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return math.inf
        return max((max_abs_diff(x, y) for x, y in zip(a, b)), default=0.0)
    return math.inf


def run_interleaved(steps: Dict[str, Step], device: torch.device, warmup: int, runs: int,
                    memory: bool, seed: int) -> dict:
    """Run every step ``warmup`` (untimed) + ``1`` (memory, if asked) + ``runs`` (timed) times,
    alternating the order each round (ABBA) so slow drifts hit all steps alike. Each round
    re-seeds the RNG identically for every step (same drop-path / sampler draws).

    Returns per-step raw times and memory, and the first-round max |ours - ref|.
    """
    names = list(steps)
    result = {n: dict(warmup_times_s=[], times_s=[]) for n in names}
    schedule = ['warmup'] * warmup + (['memory'] if memory else []) + ['timed'] * runs
    first = {}
    for r, phase in enumerate(schedule):
        for name in (names if r % 2 == 0 else names[::-1]):
            step = steps[name]
            payload = step.prepare()
            torch.manual_seed(seed + r)
            out = {}

            def work():
                out['value'] = step.call(payload)
            if phase == 'memory':
                mem = measure_peak_memory(work, device)
                result[name].update(peak_bytes=mem.peak_bytes, memory_method=mem.method)
            else:
                t = time_call(work, device)
                result[name]['warmup_times_s' if phase == 'warmup' else 'times_s'].append(t)
            if r == 0:
                first[name] = out['value']
            del out, payload
        if r == 0 and 'ref' in first and 'ours' in first:
            result['first_run_max_abs_diff'] = max_abs_diff(first['ours'], first['ref'])
        first.clear()
    for name in names:
        result[name].update(summarize(result[name]['times_s']))
    return result


# --------------------------------------------------------------------------------- cases
@dataclass
class Case:
    section: str  # 'backbone' | 'sweep' | 'whole'
    kind: str  # 'forward' | 'train'
    size: Size
    batch: int
    with_cp: bool = False
    whole: Optional[Tuple[str, str]] = None  # (label, config path)

    @property
    def key(self):
        return (self.section, self.kind, tuple(self.size), self.batch, self.with_cp)

    @property
    def name(self) -> str:
        what = self.whole[0] if self.whole else self.kind
        cp = ' with_cp' if self.with_cp else ''
        return f'{what} {self.size[0]}x{self.size[1]} b{self.batch}{cp}'


def plan_cases(args) -> List[Case]:
    cases = [Case('backbone', 'forward', *parse_case(s)) for s in args.forward]
    for spec in args.train:
        hw, b = parse_case(spec)
        cases.append(Case('backbone', 'train', hw, b))
        if args.with_cp:
            cases.append(Case('backbone', 'train', hw, b, with_cp=True))
    cases += [Case('sweep', 'forward', parse_size(s), args.sweep_batch) for s in args.sweep]
    for spec in args.whole:
        label, path, hw, b = parse_whole(spec)
        cases.append(Case('whole', 'train', hw, b, whole=(label, path)))
    return cases


class Runner:
    """Builds model pairs lazily (one per backbone config / whole model) and runs cases."""

    def __init__(self, args, device: torch.device):
        self.args = args
        self.device = device
        self.overrides = json.loads(args.backbone_kwargs)
        if not isinstance(self.overrides, dict):
            raise ValueError(f'--backbone-kwargs must be a JSON object, got '
                             f'{args.backbone_kwargs!r}')
        self.base_cfg = resolve_backbone_cfg(args.backbone, self.overrides)
        self._pairs: Dict[bool, Pair] = {}
        self.gemm: Dict[str, dict] = {}

    def backbone_pair(self, with_cp: bool) -> Pair:
        if with_cp not in self._pairs:
            cfg = dict(self.base_cfg, with_cp=with_cp)
            self._pairs[with_cp] = build_backbone_pair(cfg, self.args.reference, self.device,
                                                       self.args.seed)
        return self._pairs[with_cp]

    def _maybe_compile(self, model: nn.Module):
        if not self.args.compile:
            return model
        import torch._dynamo
        # every input size is a new graph; the default limit (8) would silently fall back to eager
        for attr in ('recompile_limit', 'cache_size_limit'):
            if hasattr(torch._dynamo.config, attr):
                setattr(torch._dynamo.config, attr, 64)
        return torch.compile(model)

    def _input(self, case: Case, batch: Optional[int] = None) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.args.seed)
        b = case.batch if batch is None else batch
        return torch.randn(b, 3, *case.size, generator=gen).to(self.device)

    def run(self, case: Case) -> dict:
        args, device = self.args, self.device
        record = dict(name=case.name, section=case.section, kind=case.kind, size=list(case.size),
                      batch=case.batch, with_cp=case.with_cp, dtype=args.dtype,
                      compile=args.compile)
        if case.section == 'whole':
            pair, host, model_cfg = build_whole_pair(case.whole[1], case.size, self.overrides,
                                                     device, args.seed)
            record.update(model=case.whole[0], **pair.info)
            if host == 'mmdet':
                batch = synthetic_det_batch(case.batch, case.size, _num_classes(model_cfg, host),
                                            args.seed)
            else:
                batch = synthetic_seg_batch(case.batch, case.size, _num_classes(model_cfg, host),
                                            args.seed)
            steps = {}
            for name, model in pair.models.items():
                model.train()
                if args.compile:
                    model.backbone.forward = torch.compile(model.backbone.forward)
                steps[name] = whole_train_step(model, batch, device, args.dtype)
        else:
            pair = self.backbone_pair(case.with_cp)
            pair.reset()
            record.update(backbone=pair.info['description'], reference=pair.info['reference'],
                          weights_identical=pair.info.get('weights_identical'))
            x = self._input(case)
            steps = {}
            for name, model in pair.models.items():
                model.train(case.kind == 'train')  # (mmdet's train() returns None: no chaining)
                runnable = self._maybe_compile(model)
                make = forward_step if case.kind == 'forward' else backbone_train_step
                steps[name] = make(runnable, x, device, args.dtype)
            # with_cp only adds recomputation: its useful FLOPs are the plain case's. Counted on
            # the reference: both do the same arithmetic, but FlopCounterMode does not see our
            # fused oneDNN linear and SDPA kernels, so counting ours would under-report.
            if args.flops and case.section == 'backbone' and not case.with_cp:
                record['flops'] = self._flops(pair.models['ref'], case)
        warmup, runs = args.warmup, args.runs
        if case.section == 'whole':
            warmup, runs = args.whole_warmup, args.whole_runs
        elif case.with_cp:
            runs = args.cp_runs
        record.update(warmup=warmup, runs=runs)
        measured = run_interleaved(steps, device, warmup, runs,
                                   memory=args.memory and case.section != 'sweep',
                                   seed=args.seed)
        record['first_run_max_abs_diff'] = measured.pop('first_run_max_abs_diff', None)
        record['variants'] = measured
        self._ratios(record)
        del steps, pair
        return record

    def _flops(self, model: nn.Module, case: Case) -> int:
        """FLOPs of the case at batch 1 times the batch (both models scale linearly in B)."""
        x1 = self._input(case, batch=1)
        was_training = model.training
        if case.kind == 'forward':
            model.eval()
            with torch.no_grad():
                per_image = count_flops(lambda: model(x1))
        else:
            model.train()  # mmdet's train() returns None: no chaining

            def fwd_bwd():
                backbone_loss(model(x1)).backward()
            per_image = count_flops(fwd_bwd)
            model.zero_grad(set_to_none=True)
        model.train(was_training)
        return per_image * case.batch

    def _ratios(self, record: dict) -> None:
        v = record['variants']
        ours, ref = v['ours'], v.get('ref')
        if ref and ours['median_s'] and ref['median_s']:
            record['speedup'] = ref['median_s'] / ours['median_s']
        if ref and ours.get('peak_bytes') and ref.get('peak_bytes'):
            record['mem_ratio'] = ours['peak_bytes'] / ref['peak_bytes']
        diff = record.get('first_run_max_abs_diff')
        if diff is not None and record['kind'] == 'forward':
            # the same weights and input must give the same pyramid (eval mode, no drop-path);
            # a train step's diff compares losses, which drop-path draws may make differ
            tol = 1e-4 if record['dtype'] == 'fp32' else 5e-2
            record['diff_tolerance'] = tol
            record['outputs_match'] = bool(diff < tol)
        if record.get('flops'):
            yardstick = self.gemm.get(record['dtype']) or self.gemm.get('fp32')
            for name in ('ours', 'ref'):
                if name in v and v[name]['median_s']:
                    gf = record['flops'] / v[name]['median_s'] / 1e9
                    v[name]['gflops_per_s'] = gf
                    if yardstick:
                        v[name]['pct_gemm_peak'] = 100.0 * gf / yardstick['gflops']
            record['pct_gemm_peak'] = v['ours'].get('pct_gemm_peak')


def add_cp_ratios(records: List[dict]) -> None:
    """Attach with_cp peak / no-cp peak (and time) to each with_cp record."""
    plain = {(r['kind'], tuple(r['size']), r['batch']): r for r in records
             if r['section'] == 'backbone' and not r['with_cp'] and 'variants' in r}
    for r in records:
        if not r.get('with_cp') or 'variants' not in r:
            continue
        base = plain.get((r['kind'], tuple(r['size']), r['batch']))
        if base is None:
            continue
        for name, v in r['variants'].items():
            b = base['variants'].get(name)
            if not isinstance(v, dict) or not b:
                continue
            if v.get('peak_bytes') and b.get('peak_bytes'):
                v['cp_mem_ratio'] = v['peak_bytes'] / b['peak_bytes']
            if v.get('median_s') and b.get('median_s'):
                v['cp_time_ratio'] = v['median_s'] / b['median_s']
        r['cp_mem_ratio'] = r['variants']['ours'].get('cp_mem_ratio')


def evaluate_targets(records: List[dict], dtype: str) -> List[dict]:
    if dtype != 'fp32':
        return []
    by_key = {(r['section'], r['kind'], tuple(r['size']), r['batch'], r['with_cp']): r
              for r in records if 'variants' in r}
    out = []
    for label, key, metric, op, goal in TARGETS:
        r = by_key.get(key)
        if r is None or r.get(metric) is None:
            continue
        value = r[metric]
        met = value >= goal if op == '>=' else value <= goal
        out.append(dict(target=label, metric=metric, value=value, goal=f'{op} {goal}', met=met))
    return out


# -------------------------------------------------------------------------------- reports
def _ms(seconds):
    return '—' if seconds is None else f'{seconds * 1e3:.1f}'


def _mib(n):
    return '—' if n is None else f'{n / MIB:.0f}'


def _x(ratio, digits=2):
    return '—' if ratio is None else f'{ratio:.{digits}f}'


def _table(header: Sequence[str], rows: List[Sequence[str]]) -> List[str]:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join('---' for _ in header) + '|']
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return lines


def render_markdown(report: dict) -> str:
    m, s = report['machine'], report['settings']
    records = report['results']
    lines = ['# mmvitswin benchmark', '',
             f"- machine: {m['cpu_model']}, {m['cpu_count']} CPUs ({m['cpu_affinity']} usable), "
             f"torch {m['torch']} with {m['torch_threads']} threads, device {m['device']}"
             + (f", GPU {m['gpu']}" if m.get('gpu') else ''),
             f"- load average at start / end: {m.get('load_average')} / "
             f"{report.get('load_average_end')}",
             f"- dtype {s['dtype']}, compile {s['compile']}, median of {s['runs']} runs after "
             f"{s['warmup']} warm-up(s) (with_cp: {s['cp_runs']} runs; whole models: "
             f"{s['whole_runs']} after {s['whole_warmup']}), memory = {s['memory_method']}",
             f"- backbone: `{report.get('backbone')}`; reference: {s['reference']}",
             f"- total wall time: {report['wall_s']:.0f} s", '']
    for dt, g in report.get('gemm_peak', {}).items():
        lines.append(f"- GEMM peak ({dt}, torch.mm {g['n']}^3): {g['gflops']:.1f} GFLOP/s")
    lines.append('')
    lines.append('speed-up = ref time / our time (> 1: ours faster); mem = our peak / ref peak '
                 '(< 1: ours leaner); peak = peak increase during one step (MiB).')
    lines.append('')

    def rows_of(section):
        return [r for r in records if r['section'] == section]

    backbone = [r for r in rows_of('backbone')]
    if backbone:
        lines += ['## Backbone', '']
        rows = []
        for r in backbone:
            if 'error' in r:
                rows.append([r['name']] + ['error'] * 10)
                continue
            o, f = r['variants']['ours'], r['variants'].get('ref', {})
            rows.append([r['name'], _ms(o['median_s']), _ms(f.get('median_s')),
                         _x(r.get('speedup')), _mib(o.get('peak_bytes')),
                         _mib(f.get('peak_bytes')), _x(r.get('mem_ratio')),
                         _x(r['flops'] / 1e9, 1) if r.get('flops') else '—',
                         _x(o.get('gflops_per_s'), 1), _x(o.get('pct_gemm_peak'), 1),
                         '—' if r.get('first_run_max_abs_diff') is None
                         else f"{r['first_run_max_abs_diff']:.1e}"])
        lines += _table(['case', 'ours ms', 'ref ms', 'speed-up', 'ours MiB', 'ref MiB', 'mem',
                         'GFLOP', 'ours GFLOP/s', '% GEMM peak', 'max abs diff'], rows)
        lines.append('')
        cp = [r for r in backbone if r.get('with_cp') and 'variants' in r]
        if cp:
            lines += ['### with_cp (activation checkpointing) against without', '']
            rows = []
            for r in cp:
                o, f = r['variants']['ours'], r['variants'].get('ref', {})
                rows.append([r['name'], _x(o.get('cp_mem_ratio')), _x(f.get('cp_mem_ratio')),
                             _x(o.get('cp_time_ratio')), _x(f.get('cp_time_ratio'))])
            lines += _table(['case', 'ours peak cp/no-cp', 'ref peak cp/no-cp',
                             'ours time cp/no-cp', 'ref time cp/no-cp'], rows)
            lines.append('')
    sweep = rows_of('sweep')
    if sweep:
        lines += ['## Forward time against input size', '']
        rows = []
        for r in sweep:
            if 'error' in r:
                rows.append([r['name'], 'error', 'error', 'error'])
                continue
            o, f = r['variants']['ours'], r['variants'].get('ref', {})
            rows.append([r['name'], _ms(o['median_s']), _ms(f.get('median_s')),
                         _x(r.get('speedup'))])
        lines += _table(['case', 'ours ms', 'ref ms', 'speed-up'], rows)
        if report.get('plot'):
            lines += ['', f"![forward time against input size]({report['plot']})"]
        lines.append('')
    whole = rows_of('whole')
    if whole:
        lines += ['## Whole model (train iteration: data_preprocessor + loss + backward + AdamW)',
                  '']
        rows = []
        for r in whole:
            if 'error' in r:
                rows.append([r['name'], 'error: ' + r['error'].splitlines()[0][:80]] + [''] * 5)
                continue
            o, f = r['variants']['ours'], r['variants']['ref']
            rows.append([r['name'], _ms(o['median_s']), _ms(f['median_s']), _x(r.get('speedup')),
                         _mib(o.get('peak_bytes')), _mib(f.get('peak_bytes')),
                         _x(r.get('mem_ratio'))])
        lines += _table(['model', 'ours ms', 'ref ms', 'speed-up', 'ours MiB', 'ref MiB', 'mem'],
                        rows)
        lines.append('')
    if report.get('targets'):
        lines += ['## Targets (issue 8)', '']
        lines += _table(['target', 'measured', 'goal', 'met'],
                        [[t['target'], _x(t['value']), t['goal'], 'yes' if t['met'] else 'NO']
                         for t in report['targets']])
        lines.append('')
    return '\n'.join(lines)


def plot_sweep(records: List[dict], path: str) -> Optional[str]:
    """Forward time against input size (the sweep, else every backbone forward case)."""
    pts = [r for r in records if r['section'] == 'sweep' and 'variants' in r]
    if not pts:
        pts = [r for r in records if r['section'] == 'backbone' and r['kind'] == 'forward'
               and 'variants' in r and r['batch'] == 1]
    if not pts:
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    pts = sorted(pts, key=lambda r: r['size'][0] * r['size'][1])
    square = all(r['size'][0] == r['size'][1] for r in pts)
    xs = [r['size'][0] if square else r['size'][0] * r['size'][1] / 1e6 for r in pts]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for name, label, style in (('ours', 'mmvitswin', 'o-'), ('ref', 'reference', 's--')):
        ys = [r['variants'][name]['median_s'] * 1e3 for r in pts
              if name in r['variants'] and r['variants'][name]['median_s']]
        if len(ys) == len(xs):
            ax.plot(xs, ys, style, label=label)
    for x, r in zip(xs, pts):
        if r.get('speedup'):
            ax.annotate(f"{r['speedup']:.2f}x", (x, r['variants']['ours']['median_s'] * 1e3),
                        textcoords='offset points', xytext=(0, -14), ha='center', fontsize=8)
    ax.set_xlabel('input side (px, square)' if square else 'input size (megapixels)')
    ax.set_ylabel('forward time (ms, median)')
    ax.set_ylim(bottom=0)  # room for the labels under the lowest points
    ax.set_title(f"forward, batch {pts[0]['batch']}, {pts[0]['dtype']} "
                 '(labels: ref time / our time)', fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--preset', choices=sorted(PRESETS),
                   help='fill every option left unset (standard = `make bench`)')
    p.add_argument('--backbone', help='registered type name, JSON dict, or config file '
                   '(uses model.backbone) [SwinTransformer]')
    p.add_argument('--backbone-kwargs', help='JSON dict merged into every backbone config, '
                   'including the backbones of --whole models [{}]')
    p.add_argument('--reference', choices=['mmdet', 'mmseg', 'none'], default='mmdet',
                   help="the reference Swin for backbone cases [mmdet]")
    p.add_argument('--forward', nargs='*',
                   help='forward (no grad) cases SIZE[:BATCH], SIZE = S|HxW')
    p.add_argument('--train', nargs='*', help='train-step cases (forward + backward + AdamW)')
    p.add_argument('--with-cp', action='store_true', default=None,
                   help='also run every --train case with with_cp=True')
    p.add_argument('--sweep', nargs='*', help='forward sizes for the plot (S or HxW)')
    p.add_argument('--sweep-batch', type=int)
    p.add_argument('--whole', nargs='*', help='whole-model train iterations: '
                   f'{"|".join(sorted(WHOLE_ALIASES))}|CONFIG[=SIZE:BATCH]')
    p.add_argument('--runs', type=int, help='timed runs per model (median reported)')
    p.add_argument('--warmup', type=int, help='untimed warm-up runs per model')
    p.add_argument('--cp-runs', type=int, help='timed runs of the with_cp cases [--runs]')
    p.add_argument('--whole-runs', type=int, help='timed runs of whole models [--runs]')
    p.add_argument('--whole-warmup', type=int, help='warm-up runs of whole models [--warmup]')
    p.add_argument('--no-memory', dest='memory', action='store_false',
                   help='skip the extra peak-memory run')
    p.add_argument('--no-flops', dest='flops', action='store_false', help='skip FLOP counting')
    p.add_argument('--no-gemm', dest='gemm', action='store_false', help='skip the GEMM peak')
    p.add_argument('--gemm-size', type=int, default=2048)
    p.add_argument('--dtype', choices=['fp32', 'bf16', 'fp16'], default='fp32',
                   help='fp32, or autocast to bf16/fp16')
    p.add_argument('--device', default='cpu', help='cpu | cuda | cuda:N')
    p.add_argument('--compile', action='store_true', help='torch.compile both models')
    p.add_argument('--threads', help="torch.set_num_threads: N, or 'auto' = every usable CPU "
                   "(default: torch's, which follows OMP_NUM_THREADS; standard: auto)")
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out-dir', default='bench_out')
    return p


def resolve_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    preset = PRESETS.get(args.preset, {})
    for key, default in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, preset.get(key, default))
    for key, fallback in (('cp_runs', 'runs'), ('whole_runs', 'runs'),
                          ('whole_warmup', 'warmup')):
        if getattr(args, key) is None:
            setattr(args, key, getattr(args, fallback))
    for key in ('runs', 'cp_runs', 'whole_runs'):
        if getattr(args, key) < 1:
            raise ValueError(f'--{key.replace("_", "-")} must be >= 1, got {getattr(args, key)}')
    for key in ('warmup', 'whole_warmup'):
        if getattr(args, key) < 0:
            raise ValueError(f'--{key.replace("_", "-")} must be >= 0, got {getattr(args, key)}')
    if args.sweep_batch < 1:
        raise ValueError(f'--sweep-batch must be >= 1, got {args.sweep_batch}')
    if args.threads == 'auto':
        args.threads = (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity')
                        else os.cpu_count() or 1)
    elif args.threads is not None:
        try:
            args.threads = int(args.threads)
        except ValueError:
            raise ValueError(f"--threads must be a positive int or 'auto', got "
                             f'{args.threads!r}') from None
        if args.threads < 1:
            raise ValueError(f'--threads must be >= 1, got {args.threads}')
    parse_dtype(args.dtype)
    return args


def main(argv=None) -> int:
    args = resolve_args(argv)
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda requested but torch.cuda.is_available() is False')
    if device.type not in ('cpu', 'cuda'):
        raise SystemExit(f'--device must be cpu or cuda[:N], got {args.device!r}')
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in both models
        torch.backends.cudnn.allow_tf32 = False
    import mmvitswin  # noqa: F401  (registers ours and bridges it into mmdet/mmseg)
    from mmengine.logging import MMLogger
    # init_weights of a whole detector logs every parameter at INFO; keep the report readable
    MMLogger.get_instance('mmvitswin-benchmark', log_level='WARNING')

    start = time.perf_counter()
    os.makedirs(args.out_dir, exist_ok=True)
    cases = plan_cases(args)
    runner = Runner(args, device)
    report = dict(machine=machine_info(device), backbone=_describe(runner.base_cfg),
                  settings=dict(vars(args)), results=[])
    report['settings']['memory_method'] = (report['machine'].get('cpu_memory_method')
                                           if device.type == 'cpu' else 'cuda-max-allocated')
    if args.gemm:
        dtypes = ['fp32'] + ([args.dtype] if args.dtype != 'fp32' else [])
        for dt in dtypes:
            runner.gemm[dt] = gemm_peak(device, parse_dtype(dt), n=args.gemm_size)
            print(f"[bench] GEMM peak {dt}: {runner.gemm[dt]['gflops']:.1f} GFLOP/s",
                  file=sys.stderr)
        report['gemm_peak'] = runner.gemm
    errors = 0
    for i, case in enumerate(cases):
        t0 = time.perf_counter()
        try:
            record = runner.run(case)
        except Exception as exc:  # one broken case must not lose the others' figures
            errors += 1
            traceback.print_exc()
            record = dict(name=case.name, section=case.section, kind=case.kind,
                          size=list(case.size), batch=case.batch, with_cp=case.with_cp,
                          error=f'{type(exc).__name__}: {exc}')
        record['case_wall_s'] = time.perf_counter() - t0
        report['results'].append(record)
        v = record.get('variants', {})
        print(f"[bench] {i + 1}/{len(cases)} {case.name}: ours "
              f"{_ms(v.get('ours', {}).get('median_s'))} ms, ref "
              f"{_ms(v.get('ref', {}).get('median_s'))} ms, speed-up {_x(record.get('speedup'))}, "
              f"mem {_x(record.get('mem_ratio'))}" + (' ERROR' if 'error' in record else ''),
              file=sys.stderr, flush=True)
    add_cp_ratios(report['results'])
    report['targets'] = evaluate_targets(report['results'], args.dtype)
    report['plot'] = None
    try:
        plot = plot_sweep(report['results'], os.path.join(args.out_dir, 'forward_vs_size.png'))
        report['plot'] = os.path.basename(plot) if plot else None
    except ImportError as exc:
        print(f'[bench] no plot: {exc} (pip install matplotlib)', file=sys.stderr)
    report['load_average_end'] = list(os.getloadavg()) if hasattr(os, 'getloadavg') else None
    report['wall_s'] = time.perf_counter() - start
    report['errors'] = errors
    markdown = render_markdown(report)
    with open(os.path.join(args.out_dir, 'benchmark.json'), 'w') as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(args.out_dir, 'benchmark.md'), 'w') as f:
        f.write(markdown + '\n')
    print(markdown)
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())

"""`make demo`: train and evaluate a Swin detector (or segmentor) on generated "shapes" data.

    python tools/demo.py                       # Mask R-CNN + Swin-nano, CocoMetric bbox + segm
    python tools/demo.py --seg                 # UPerNet + Swin-nano, mIoU
    python tools/demo.py --work-dir W --data-root D --config C [--max-iters N]
    python tools/demo.py --precision fp32      # default 'auto': bf16 where the CPU has it

Steps: generate the data under ``--data-root`` if it is missing (tools/make_shapes.py), train
with the MMEngine Runner (progress and ETA in the log), evaluate on the val split, draw the
predictions on a val image with mmdet's DetLocalVisualizer (mmseg's SegLocalVisualizer for
``--seg``) next to the ground truth, and print where the work dir, checkpoint, metrics JSON and
PNGs are. ``--precision auto`` trains in bf16 mixed precision (``CPUAmpOptimWrapper``) when
the CPU runs bf16 natively (AMX-BF16 or AVX512-BF16), else in fp32; the output says which ran.
"""
import argparse
import json
import os
import os.path as osp
import sys
import time
from typing import Dict, Optional, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CONFIG = osp.join(ROOT, 'configs', 'demo', 'mask_rcnn_swin_nano_shapes.py')
SEG_CONFIG = osp.join(ROOT, 'configs', 'demo', 'upernet_swin_nano_shapes.py')


def rebase_data_root(cfg: Config, new_root: str) -> int:
    """Point every config string that starts with ``cfg.data_root`` at ``new_root`` instead.

    MMEngine substitutes ``data_root`` into the dataset entries when the file is parsed, so
    changing the variable afterwards reaches nothing; this rewrites the derived paths (dataset
    ``data_root``, evaluator ``ann_file``). Returns how many entries were changed.
    """
    old_root = cfg.get('data_root')
    if not old_root:
        raise ValueError('the config has no top-level data_root to rebase')
    old_root = old_root.rstrip('/') + '/'
    new_root = new_root.rstrip('/') + '/'
    changed = 0

    def walk(node):
        nonlocal changed
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and value.startswith(old_root):
                    node[key] = new_root + value[len(old_root):]
                    changed += 1
                else:
                    walk(value)
        elif isinstance(node, (list, tuple)):
            for item in node:
                walk(item)

    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader', 'val_evaluator',
                'test_evaluator'):
        if key in cfg:
            walk(cfg[key])
    cfg.data_root = new_root
    return changed


class _MetricsRecorder(Hook):
    """Keeps the metrics of the last validation (the Runner does not return them)."""
    priority = 'LOWEST'

    def __init__(self):
        self.metrics: Dict[str, float] = {}

    def after_val_epoch(self, runner, metrics: Optional[Dict[str, float]] = None) -> None:
        # mmseg reports numpy scalars; keep plain floats so the record is JSON.
        self.metrics = {k: float(v) if hasattr(v, '__float__') else v
                        for k, v in (metrics or {}).items()}


def ensure_shapes(data_root: str, image_size, log=print) -> bool:
    """Generate the shapes data under ``data_root`` unless it is there; True if generated.

    A folder that holds the demos' own data set (seed 0, 1000 train images, this size) with
    fewer val images than the default (100 before the val split grew to 500) is regenerated in
    place: the train images and the first val images come out byte-identical, the rest are
    added. Any other shapes data is used as it is.
    """
    from mmvitswin.openmmlab.datasets import (DEFAULT_NUM_TRAIN, DEFAULT_NUM_VAL, DEFAULT_SEED,
                                              make_shapes, shapes_summary)
    found = shapes_summary(data_root)
    if found is not None:
        own = (found['seed'] == DEFAULT_SEED and found['train'] == DEFAULT_NUM_TRAIN
               and tuple(found['image_size']) == tuple(image_size))
        if not (own and found['val'] < DEFAULT_NUM_VAL):
            log(f"[demo] using the shapes data in {data_root} ({found['train']} train / "
                f"{found['val']} val images)")
            return False
        log(f"[demo] the shapes data in {data_root} has {found['val']} val images, the demo "
            f'evaluates on {DEFAULT_NUM_VAL}: regenerating (the existing images come out '
            'identical) ...')
    else:
        log(f'[demo] generating the shapes data in {data_root} ...')
    start = time.time()
    summary = make_shapes(data_root, num_train=DEFAULT_NUM_TRAIN, num_val=DEFAULT_NUM_VAL,
                          image_size=tuple(image_size), seed=DEFAULT_SEED)
    log(f"[demo] {summary['train']['images']} train / {summary['val']['images']} val images "
        f'in {time.time() - start:.1f}s')
    return True


def latest_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint the Runner names in ``last_checkpoint``, if any."""
    marker = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(marker):
        with open(marker) as f:
            path = f.read().strip()
        if osp.isfile(path):
            return path
    return None


def first_val_sample(runner):
    """The first val image path and its packed ground-truth data sample."""
    dataset = runner.val_dataloader.dataset
    item = dataset[0]
    return dataset.get_data_info(0)['img_path'], item['data_samples']


def choose_precision(requested: str = 'auto') -> Tuple[str, str]:
    """('bf16' | 'fp32', why) for ``--precision``: 'auto' takes bf16 where the CPU runs it
    natively and no GPU is present."""
    import torch
    from mmvitswin.openmmlab.engine.amp import cpu_bf16_support
    if requested == 'fp32':
        return 'fp32', 'requested'
    if torch.cuda.is_available():
        return ('bf16', 'requested, on CUDA') if requested == 'bf16' else (
            'fp32', 'CUDA device: use tools/train.py --amp for mixed precision')
    native, found = cpu_bf16_support()
    if requested == 'bf16':
        return 'bf16', 'requested' + ('' if native else f' ({found}: emulated, slow)')
    return ('bf16', f'CPU has {found}') if native else ('fp32', found)


def run_demo(config: str, work_dir: str, data_root: str, max_iters: Optional[int] = None,
             cfg_options: Optional[dict] = None, log=print,
             precision: str = 'auto') -> Dict[str, object]:
    """Generate data if needed, train, evaluate, draw; return a summary of the outputs."""
    import mmvitswin  # noqa: F401
    import torch
    from mmvitswin.openmmlab.engine.amp import apply_amp
    from mmvitswin.openmmlab.engine.launch import build_runner

    from visualize import visualize

    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    rebase_data_root(cfg, data_root)
    if max_iters is not None:
        if max_iters < 1:
            raise ValueError(f'max_iters must be >= 1, got {max_iters}')
        cfg.train_cfg.max_iters = max_iters
        cfg.train_cfg.val_interval = max_iters
        cfg.default_hooks.checkpoint.interval = max_iters
        cfg.default_hooks.logger.interval = min(cfg.default_hooks.logger.interval, max_iters)
        # The schedulers were written for the full length; keep them inside the shorter run.
        for sched in cfg.param_scheduler:
            sched['begin'] = min(sched.get('begin', 0), max_iters - 1)
            sched['end'] = max(min(sched.get('end', max_iters), max_iters), sched['begin'] + 1)
    cfg.work_dir = work_dir
    precision, why = choose_precision(precision)
    if precision == 'bf16':
        apply_amp(cfg.optim_wrapper, torch.cuda.is_available(), 'bf16')
    log(f'[demo] precision: {precision} ({why})')
    ensure_shapes(data_root, cfg.get('image_size', (128, 128)), log)

    start = time.time()
    runner = build_runner(cfg)  # the config's SafeCheckpointRunner (atomic checkpoints)
    recorder = _MetricsRecorder()
    runner.register_hook(recorder)
    runner.train()
    train_eval_s = time.time() - start

    metrics_json = osp.join(work_dir, 'metrics.json')
    with open(metrics_json, 'w') as f:
        json.dump(dict(config=osp.abspath(config), train_and_eval_seconds=round(train_eval_s, 1),
                       max_iters=cfg.train_cfg.max_iters, precision=precision,
                       precision_reason=why, metrics=recorder.metrics), f, indent=2)
    img_path, gt_sample = first_val_sample(runner)
    runner.model.eval()
    pngs = visualize(cfg, runner.model, img_path, osp.join(work_dir, 'vis'),
                     draw_gt_sample=gt_sample)
    return dict(work_dir=osp.abspath(work_dir), checkpoint=latest_checkpoint(work_dir),
                metrics_json=metrics_json, metrics=recorder.metrics, pngs=pngs,
                train_and_eval_seconds=train_eval_s, log_dir=runner.log_dir,
                precision=precision, precision_reason=why)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--seg', action='store_true',
                        help='run the UPerNet segmentation demo instead of Mask R-CNN')
    parser.add_argument('--config', help='config to train (default: the demo config)')
    parser.add_argument('--work-dir', help='output folder (default: work_dirs/<config name>)')
    parser.add_argument('--data-root', default='data/shapes',
                        help='shapes data folder; generated if missing (default data/shapes)')
    parser.add_argument('--max-iters', type=int, help='train this many iterations instead')
    parser.add_argument('--precision', choices=['auto', 'bf16', 'fp32'], default='auto',
                        help='training precision; auto = bf16 mixed precision where the CPU '
                        'has AMX-BF16/AVX512-BF16, else fp32 (default auto)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, key=value')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    config = args.config or (SEG_CONFIG if args.seg else DET_CONFIG)
    if not osp.isfile(config):
        print(f'demo: config not found: {config}', file=sys.stderr)
        return 2
    work_dir = args.work_dir or osp.join('work_dirs', osp.splitext(osp.basename(config))[0])
    os.makedirs(work_dir, exist_ok=True)
    summary = run_demo(config, work_dir, args.data_root, args.max_iters, args.cfg_options,
                       precision=args.precision)
    minutes = summary['train_and_eval_seconds'] / 60
    metrics = summary['metrics']
    shown = {k: v for k, v in metrics.items()
             if k.endswith(('bbox_mAP', 'segm_mAP', 'mIoU', 'aAcc'))}
    print('\n[demo] done in {:.1f} min (train + eval)'.format(minutes))
    print(f"[demo] precision:    {summary['precision']} ({summary['precision_reason']})")
    for key, value in shown.items():
        print(f'[demo]   {key}: {value}')
    print(f"[demo] work dir:     {summary['work_dir']}")
    print(f"[demo] log:          {summary['log_dir']}")
    print(f"[demo] checkpoint:   {summary['checkpoint']}")
    print(f"[demo] metrics json: {summary['metrics_json']}")
    print(f"[demo] predictions:  {summary['pngs']['prediction']}")
    print(f"[demo] features:     {summary['pngs']['features']}")
    return 0


if __name__ == '__main__':
    sys.exit(main())

#!/usr/bin/env python
"""Train a detector or segmentor from an mmvitswin (or any mmdet/mmseg) config.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CHECKPOINT]] [--amp [--amp-dtype D]]
                          [--cfg-options KEY=VALUE ...] [--launcher none|pytorch|slurm|mpi]

The config's ``default_scope`` ('mmdet' or 'mmseg') decides which library builds it. Several
processes: tools/dist_train.sh CONFIG NUM_PROCS (gloo on CPU, NCCL on GPUs).
Exit status 2 (and one message, no traceback) when the config, a checkpoint or the dataset is
missing.
"""
import argparse
import os
import sys

from mmengine.config import DictAction


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model with MMEngine\'s Runner')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--work-dir', help='where logs and checkpoints go '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto', default=None, metavar='CHECKPOINT',
        help='resume training: alone, from the latest checkpoint in the work dir; with a path, '
        'from that checkpoint (model, optimizer, schedulers, iteration and message hub)')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision: bf16 on CPU (CPUAmpOptimWrapper), fp16 with '
                        'dynamic loss scaling on CUDA (AmpOptimWrapper)')
    parser.add_argument('--amp-dtype', choices=['bf16', 'fp16'],
                        help='with --amp: bf16 (the default on CPU, the only choice there) or '
                        'fp16 (the default on CUDA)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by actual batch size / the config\'s base batch size')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config entries, e.g. train_cfg.max_iters=100 '
        'model.backbone.init_cfg=None "model.backbone.depths=[1,1,1,1]"')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank (torch >= 2.0) or --local_rank
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import mmvitswin  # noqa: F401  (registries and host bridge)
    from mmvitswin.openmmlab.engine.data_check import missing_data, missing_data_message
    from mmvitswin.openmmlab.engine.launch import (ToolError, build_runner, init_distributed,
                                                   load_config, prepare_config)
    from mmvitswin.openmmlab.engine.safe_load import UntrustedCheckpointError
    try:
        cfg = load_config(args.config, args.cfg_options)
        notes = prepare_config(cfg, args.config, launcher=args.launcher,
                               work_dir=args.work_dir, resume=args.resume, amp=args.amp,
                               amp_dtype=args.amp_dtype)
        if args.amp_dtype and not args.amp:
            raise ToolError('--amp-dtype needs --amp')
        if not args.amp:
            wrapper = (cfg.get('optim_wrapper') or {}).get('type', 'OptimWrapper')
            wrapper = str(wrapper).split('.')[-1]
            notes.append('precision: fp32 (no --amp)' if wrapper == 'OptimWrapper' else
                         f'precision: as the config\'s {wrapper} sets it')
        if args.auto_scale_lr:
            if not isinstance(cfg.get('auto_scale_lr'), dict) or \
                    'base_batch_size' not in cfg.auto_scale_lr:
                raise ToolError('--auto-scale-lr needs auto_scale_lr.base_batch_size in the '
                                'config')
            cfg.auto_scale_lr.enable = True
        splits = ['train'] + (['val'] if cfg.get('val_cfg') and cfg.get('val_dataloader')
                              else [])
        problems = missing_data(cfg, splits)
        if problems:
            raise ToolError(missing_data_message(problems, args.config))
        init_distributed(args.launcher)
    except ToolError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 2

    runner = build_runner(cfg)  # the config's runner_type; SafeCheckpointRunner if none
    for note in notes:
        runner.logger.info(f'mmvitswin tools: {note}')
    try:
        runner.train()
    except UntrustedCheckpointError as exc:  # e.g. --resume found a refused latest checkpoint
        print(f'error: {exc}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())

#!/usr/bin/env python
"""Evaluate a checkpoint on the test split of a config (mmdet or mmseg, by its scope).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--amp [--amp-dtype D]]
                         [--cfg-options KEY=VALUE ...] [--launcher none|pytorch|slurm|mpi]

``--amp`` evaluates with ``test_step`` under ``torch.autocast`` (bf16 on CPU, fp16 on CUDA unless
``--amp-dtype``), through :class:`mmvitswin.openmmlab.engine.amp.AmpTestLoop`.

Several processes: tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS. Exit status 2 (and one
message, no traceback) when the config, the checkpoint or the dataset is missing.
"""
import argparse
import os
import sys

from mmengine.config import DictAction


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test a model with MMEngine\'s Runner')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file (path or URL)')
    parser.add_argument('--work-dir', help='where logs and metrics go '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--amp', action='store_true',
                        help='mixed-precision inference (bf16 on CPU, fp16 on CUDA)')
    parser.add_argument('--amp-dtype', choices=['bf16', 'fp16'],
                        help='with --amp: bf16 or fp16 (CUDA only)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. test_dataloader.batch_size=1')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
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
                               work_dir=args.work_dir, load_from=args.checkpoint)
        cfg.resume = False
        if args.amp_dtype and not args.amp:
            raise ToolError('--amp-dtype needs --amp')
        if args.amp:
            import torch
            from mmvitswin.openmmlab.engine.amp import resolve_amp_dtype
            try:
                dtype = resolve_amp_dtype(args.amp_dtype, torch.cuda.is_available())
            except ValueError as exc:
                raise ToolError(str(exc)) from None
            loop = dict(cfg.get('test_cfg') or {})
            kind = str(loop.pop('type', 'TestLoop')).split('.')[-1]
            if kind not in ('TestLoop', 'AmpTestLoop'):
                raise ToolError('--amp replaces test_cfg with AmpTestLoop; the config has a '
                                'custom test loop')
            loop.pop('fp16', None)
            cfg.test_cfg = dict(loop, type='mmvitswin.AmpTestLoop',
                                dtype='bfloat16' if dtype == 'bf16' else 'float16')
            notes.append(f'precision: {dtype} mixed-precision inference (AmpTestLoop)')
        else:
            notes.append('precision: fp32 (no --amp)')
        problems = missing_data(cfg, ['test'])
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
        metrics = runner.test()
    except UntrustedCheckpointError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 2
    from mmengine.dist import get_rank
    if get_rank() == 0:
        print(metrics)
    return 0


if __name__ == '__main__':
    sys.exit(main())

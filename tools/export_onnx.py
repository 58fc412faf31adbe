#!/usr/bin/env python
"""Export a backbone to ONNX with dynamic batch, H and W, and check it in onnxruntime.

    python tools/export_onnx.py CONFIG_OR_TYPE --shape H W [--checkpoint PATH] [--out FILE]
                                [--check-shape H W] [--batch N] [--frames T] [--tol 1e-4]
                                [--cfg-options KEY=VALUE ...]

CONFIG_OR_TYPE: an mmdet/mmseg config file (its ``model.backbone`` is exported;
``--cfg-options`` then overrides config keys, e.g. ``model.backbone.arch=small``) or a
registered backbone type such as ``SwinTransformer`` (``--cfg-options`` then sets its
arguments, e.g. ``arch=tiny window_size=12``). ``--checkpoint`` loads weights in any format
the backbone's ``init_cfg`` accepts. The model is exported at ``--shape``, run in onnxruntime at
``--check-shape`` (default: another, odd size) and compared with eager PyTorch; the exit status
is 1 when the largest error relative to the output's magnitude exceeds ``--tol``.
Needs ``pip install -e .[deploy]`` (installed by ``make install``).
"""
import argparse
import os.path as osp
import sys

from mmengine.config import DictAction


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Export a backbone to ONNX and check it')
    p.add_argument('model', help='config file, or a registered backbone type')
    p.add_argument('--shape', nargs=2, type=int, required=True, metavar=('H', 'W'),
                   help='input size used for tracing')
    p.add_argument('--check-shape', nargs=2, type=int, metavar=('H', 'W'),
                   help='input size of the onnxruntime check (default: another odd size)')
    p.add_argument('--batch', type=int, default=1, help='batch size of the trace input')
    p.add_argument('--frames', type=int, default=8,
                   help='clip length T for video backbones (5-D input)')
    p.add_argument('--checkpoint', help='weights to load (any supported format)')
    p.add_argument('--out', help='output file (default: <type>.onnx)')
    p.add_argument('--tol', type=float, default=1e-4,
                   help='max error relative to the output magnitude (default 1e-4)')
    p.add_argument('--opset', type=int, default=18, help='ONNX opset, >= 16')
    p.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                   help='config overrides (config file) or backbone arguments (type)')
    return p.parse_args(argv)


def build_backbone(model: str, options: dict):
    """The backbone of a config file, or a registered type built with ``options``."""
    import mmvitswin  # noqa: F401  (registers the backbones)
    from mmengine.config import Config
    from mmvitswin.openmmlab.registry import MODELS
    if model.endswith('.py'):
        if not osp.isfile(model):
            raise SystemExit(f'error: config file not found: {model}')
        cfg = Config.fromfile(model)
        cfg.merge_from_dict(options)
        backbone = dict(cfg.model.backbone)
        backbone['type'] = backbone['type'].split('.')[-1]
    else:
        backbone = dict(options, type=model.split('.')[-1])
    backbone['init_cfg'] = None  # weights come from --checkpoint only: no download here
    if MODELS.get(backbone['type']) is None:
        raise SystemExit(f'error: {backbone["type"]!r} is not a registered mmvitswin backbone')
    return MODELS.build(backbone)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from mmvitswin.core.deploy import compare_onnx, export_onnx, second_size
    model = build_backbone(args.model, args.cfg_options)
    if args.checkpoint:
        from mmvitswin.core.checkpoint import load_pretrained
        load_pretrained(model, args.checkpoint)
    model.eval()
    video = type(model).__name__.endswith('3D')
    lead = (args.batch, model.in_channels) + ((args.frames, ) if video else ())
    out = args.out or f'{type(model).__name__}.onnx'
    torch.manual_seed(0)
    example = torch.randn(*lead, *args.shape)
    names = export_onnx(model, example, out, opset=args.opset)
    check = second_size(args.shape, args.check_shape)
    x = torch.randn(args.batch + 1, *lead[1:], *check)
    errors = compare_onnx(model, out, x)
    print(f'exported {type(model).__name__} to {out} ({len(names)} outputs, traced at '
          f'{tuple(example.shape)})')
    print(f'onnxruntime at {tuple(x.shape)}: max relative error per output '
          + ', '.join(f'{e:.2e}' for e in errors) + f' (tolerance {args.tol:g})')
    if max(errors) > args.tol:
        print('error: the ONNX model differs from PyTorch beyond the tolerance',
              file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())

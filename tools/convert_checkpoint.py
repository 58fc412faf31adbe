#!/usr/bin/env python
"""Convert a backbone checkpoint to mmvitswin's layout offline.

Examples::

    # Microsoft / timm Swin release -> mmdet/mmseg/mmvitswin Swin keys (no model needed)
    python tools/convert_checkpoint.py swin_tiny_patch4_window7_224.pth swin_t_mmdet.pth

    # ... fitted to a specific backbone (window 12, 384 pretrain): tables are resized
    python tools/convert_checkpoint.py swin_base_patch4_window12_384.pth out.pth \
        --backbone '{"type": "SwinTransformer", "arch": "base", "window_size": 12}'

    # any family the backbone understands (ViT, hybrid ViT, video Swin inflation), wrapped
    # with a `backbone.` prefix so a detector's `load_from` takes it
    python tools/convert_checkpoint.py deit_base.pth vit_b.pth \
        --backbone '{"type": "ViTAdapter", "arch": "base"}' --prefix backbone.

The output is ``{'state_dict': ..., 'meta': {...}}``, loadable by ``init_cfg=dict(type=
'Pretrained', checkpoint=...)`` and by the runner's ``load_from``. The input file is never
modified, and an existing output file is not overwritten unless ``--force`` is given.
"""
import argparse
import json
import os
import sys

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('src', help='input checkpoint (path or URL)')
    p.add_argument('dst', help='output file')
    p.add_argument('--backbone', default=None,
                   help='JSON dict of the target backbone config (type + kwargs); without it '
                   'the input is treated as a 2-D Swin and only renamed')
    p.add_argument('--prefix', default='', help="key prefix for the output, e.g. 'backbone.'")
    p.add_argument('--force', action='store_true', help='overwrite an existing dst')
    return p.parse_args(argv)


def convert(src: str, backbone_cfg=None):
    """Return ``(state_dict, description)`` for the checkpoint at ``src``."""
    import mmvitswin  # noqa: F401  (registers the backbones)
    from mmvitswin.core.checkpoint import load_checkpoint_file, unwrap_state_dict
    from mmvitswin.core.checkpoint.swin import convert_swin_state_dict
    sd = unwrap_state_dict(load_checkpoint_file(src))
    if backbone_cfg is None:
        out, fmt = convert_swin_state_dict(sd)
        return out, f'Swin, detected format: {fmt}'
    from mmvitswin.openmmlab.registry import MODELS
    cfg = dict(backbone_cfg)
    model = MODELS.build(cfg)
    if not hasattr(model, 'convert_checkpoint'):
        raise ValueError(f'{type(model).__name__} has no checkpoint converter')
    out = model.convert_checkpoint(sd)
    own = model.state_dict()
    bad = [k for k, v in out.items() if k in own and own[k].shape != v.shape]
    if bad:
        raise ValueError(f'converted keys do not fit {cfg.get("type")}: {bad[:5]}')
    unused = sorted(set(out) - set(own))
    missing = sorted(set(own) - set(out))
    return out, (f'{type(model).__name__}: {len(out)} tensors, {len(missing)} missing in the '
                 f'checkpoint, {len(unused)} unused: {unused[:8]}')


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.path.exists(args.dst) and not args.force:
        print(f'convert_checkpoint: {args.dst} exists; pass --force to overwrite it',
              file=sys.stderr)
        return 2
    if os.path.abspath(args.dst) == os.path.abspath(args.src):
        print('convert_checkpoint: dst must differ from src', file=sys.stderr)
        return 2
    backbone = None
    if args.backbone:
        try:
            backbone = json.loads(args.backbone)
        except json.JSONDecodeError as exc:
            print(f'convert_checkpoint: --backbone is not valid JSON: {exc}', file=sys.stderr)
            return 2
        if not isinstance(backbone, dict) or 'type' not in backbone:
            print("convert_checkpoint: --backbone must be a JSON object with a 'type'",
                  file=sys.stderr)
            return 2
    try:
        sd, desc = convert(args.src, backbone)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f'convert_checkpoint: {exc}', file=sys.stderr)
        return 2
    sd = {args.prefix + k: v.contiguous() for k, v in sd.items()}
    tmp = args.dst + '.tmp'
    torch.save({'state_dict': sd, 'meta': {'converted_from': os.path.basename(args.src),
                                            'converter': 'mmvitswin'}}, tmp)
    os.replace(tmp, args.dst)  # never leave a half-written file under the final name
    print(f'{desc}\nwrote {len(sd)} tensors to {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

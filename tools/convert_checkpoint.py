#!/usr/bin/env python
"""Convert a backbone checkpoint to mmvitswin's layout offline.

Examples::

    # Microsoft / timm / HF Swin release -> mmdet/mmseg/mmvitswin Swin keys (no model needed);
    # a Swin V2 file (told apart by its keys) -> SwinTransformerV2's keys
    python tools/convert_checkpoint.py swin_tiny_patch4_window7_224.pth swin_t_mmdet.pth

    # ... fitted to a specific backbone (window 12, 384 pretrain): tables are resized
    python tools/convert_checkpoint.py swin_base_patch4_window12_384.pth out.pth \
        --backbone '{"type": "SwinTransformer", "arch": "base", "window_size": 12}'

    # any family the backbone understands (ViT, hybrid ViT, video Swin inflation), wrapped
    # with a `backbone.` prefix so a detector's `load_from` takes it
    python tools/convert_checkpoint.py deit_base.pth vit_b.pth \
        --backbone '{"type": "ViTAdapter", "arch": "base"}' --prefix backbone.

    # a sharded checkpoint directory saved under FSDP2Strategy -> one runner checkpoint file
    # (weights, meta, message hub, schedulers; not the optimizer) for tools/test.py and DDP
    python tools/convert_checkpoint.py work_dirs/cfg/iter_5000.pth iter_5000_full.pth

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
                   'the input is taken as a 2-D Swin (V1, or V2 where its keys say so) and only '
                   'renamed')
    p.add_argument('--prefix', default='', help="key prefix for the output, e.g. 'backbone.'")
    p.add_argument('--force', action='store_true', help='overwrite an existing dst')
    return p.parse_args(argv)


def convert(src: str, backbone_cfg=None):
    """Return ``(state_dict, description)`` for the checkpoint at ``src``.

    With ``backbone_cfg`` the state dict is fitted to that backbone by the core's one entry
    point (:func:`mmvitswin.core.checkpoint.fit_checkpoint` with the backbone's family) and
    loaded into it by :func:`~mmvitswin.core.checkpoint.load_state_dict_reported`, which
    refuses shape mismatches and reports missing and unused keys.
    """
    import warnings

    import mmvitswin  # noqa: F401  (registers the backbones)
    from mmvitswin.core.checkpoint import (fit_checkpoint, load_state_dict_reported,
                                           read_checkpoint, unwrap_state_dict)
    from mmvitswin.core.checkpoint.swin import convert_swin_state_dict, is_swinv2_state_dict
    from mmvitswin.core.checkpoint.swin_v2 import convert_swinv2_state_dict, swinv2_config_arch
    from mmvitswin.core.layers import log_spaced_relative_coords
    ckpt = read_checkpoint(src)
    sd = unwrap_state_dict(ckpt.obj)
    if backbone_cfg is None:
        if is_swinv2_state_dict(sd):
            # The windows its position-bias MLPs were trained at go with it, so that loading
            # the output into SwinTransformerV2 still checks them: Microsoft's and mmpretrain's
            # coordinate tables keep our names; what a config.json beside the weights (HF, timm
            # hub snapshots) states is written as such tables, in Microsoft's (1, 2h-1, 2w-1, 2)
            # shape, from which a non-square window reads back too.
            out, fmt = convert_swinv2_state_dict(sd)
            windows = swinv2_config_arch(ckpt.config or {}).get('pretrained_window_sizes')
            if windows and not any(k.endswith('relative_coords_table') for k in out):
                for stage, window in enumerate(windows):
                    h, w = (window, window) if isinstance(window, int) else window
                    out[f'stages.{stage}.blocks.0.attn.w_msa.relative_coords_table'] = \
                        log_spaced_relative_coords((h, w), (h, w)).view(1, 2 * h - 1, 2 * w - 1, 2)
            return out, f'Swin V2, detected format: {fmt}'
        out, fmt = convert_swin_state_dict(sd)
        return out, f'Swin, detected format: {fmt}'
    from mmvitswin.openmmlab.registry import MODELS
    model = MODELS.build(dict(backbone_cfg))
    family = model.checkpoint_family() if hasattr(model, 'checkpoint_family') else None
    if family is None:
        raise ValueError(f'{type(model).__name__} has no checkpoint family to convert with')
    out = fit_checkpoint(family, sd, model, config=ckpt.config)
    with warnings.catch_warnings():  # the report below says it once
        warnings.simplefilter('ignore')
        report = load_state_dict_reported(model, out, source=src)
    return out, (f'{type(model).__name__}: {len(out)} tensors, {len(report.missing)} missing '
                 f'in the checkpoint, {len(report.unexpected)} unused: '
                 f'{report.unexpected[:8]}')


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.path.exists(args.dst) and not args.force:
        print(f'convert_checkpoint: {args.dst} exists; pass --force to overwrite it',
              file=sys.stderr)
        return 2
    if os.path.abspath(args.dst) == os.path.abspath(args.src):
        print('convert_checkpoint: dst must differ from src', file=sys.stderr)
        return 2
    from mmvitswin.openmmlab.engine.checkpoint_io import is_sharded_checkpoint
    if os.path.isdir(args.src) and is_sharded_checkpoint(args.src):
        from mmvitswin.openmmlab.engine.fsdp import consolidate_checkpoint
        if args.backbone or args.prefix:
            print('convert_checkpoint: a sharded runner checkpoint is consolidated as it is '
                  '(--backbone and --prefix do not apply)', file=sys.stderr)
            return 2
        consolidate_checkpoint(args.src, args.dst)
        print(f'consolidated the sharded checkpoint {args.src} into {args.dst}')
        return 0
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

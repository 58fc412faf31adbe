#!/usr/bin/env python
"""Per-GPU memory estimates of the foundation ViT trunks under DDP and FSDP2 (docs/fsdp.md).

    python tools/fsdp_memory.py [--gpus 8] [--sizes 512 1024] [--batch 2]

Parameters are counted on the meta device (the whole trunk + the simple pyramid, as
``ViTAdapter(arch, adapter='simple')`` builds it). Activations are *measured*: one block of
each trunk at full width runs forward on the CPU under bf16 autocast at each image size, and
the bytes of every tensor autograd keeps for the backward are summed; a checkpointed block
keeps its input only. Per GPU, with ``N`` GPUs and fp32 master weights under AdamW:

- DDP: weights 4 B/param, gradients 4, AdamW states 8, all replicated;
- FSDP2: the same divided by ``N``, plus two units gathered in bf16 at a time (the block
  running and the next one prefetched), and their fp32 gradients before the reduce-scatter;
- frozen trunk (FSDP2): trunk weights 4 B/param / N, no gradients, no states, no activations
  kept (only one block's working set); the pyramid trains.

Heads, FPN, the data and the allocator's slack are not counted: these are estimates of what
the backbone adds, to compare set-ups, not to budget a GPU to the megabyte.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ARCHES = ('dinov3-s', 'dinov3-b', 'dinov3-l', 'dinov3-h+', 'dinov2-g', 'dinov3-7b')
GIB = 2 ** 30


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--arches', nargs='+', default=list(ARCHES))
    p.add_argument('--gpus', type=int, default=8)
    p.add_argument('--sizes', type=int, nargs='+', default=[512, 1024],
                   help='square image sizes (pixels)')
    p.add_argument('--batch', type=int, default=2, help='images per GPU')
    return p.parse_args(argv)


def count_params(arch: str) -> dict:
    """Parameters of the trunk, of one block and of the simple pyramid (meta device)."""
    from mmvitswin.core.backbones.vit import ViTAdapter
    with torch.device('meta'):
        model = ViTAdapter(arch=arch, adapter='simple')
    total = sum(p.numel() for p in model.parameters())
    pyramid = sum(p.numel() for p in model.adapter.parameters())
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return dict(trunk=total - pyramid, pyramid=pyramid, block=block, depth=len(model.blocks),
                width=model.embed_dims, patch=model.patch_size)


def block_activations(arch: str, size: int) -> dict:
    """Bytes autograd keeps for one block at ``size`` x ``size``, batch 1, under bf16 autocast
    (measured), and the bytes of the block's input (what a checkpointed block keeps)."""
    from mmvitswin.core.backbones.vit import ViTAdapter
    torch.manual_seed(0)
    model = ViTAdapter(arch=arch, num_layers=1)
    x = torch.randn(1, 3, size, size)
    seq, grid = model.prepare_tokens(x)
    seq = seq.detach().requires_grad_(True)
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size() if t.data_ptr() != seq.data_ptr() else 0)
        return t

    with torch.autocast('cpu', dtype=torch.bfloat16):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.blocks[0](seq, grid, model.num_prefix_tokens)
    return dict(kept=sum(kept), block_input=seq.numel() * 2)  # bf16 block inputs


def estimate(p: dict, act: dict, gpus: int, batch: int) -> dict:
    """GiB per GPU of each set-up (module docstring)."""
    trunk, blk, depth = p['trunk'] + p['pyramid'], p['block'], p['depth']
    full = batch * depth * act['kept']
    ckpt = batch * (depth * act['block_input'] + act['kept'])
    gathered = 2 * blk * 2 + blk * 4  # two units in bf16 + one unit's fp32 gradients
    out = {
        'DDP': 16 * trunk + full, 'DDP + ckpt': 16 * trunk + ckpt,
        'FSDP2': 16 * trunk / gpus + gathered + full,
        'FSDP2 + ckpt': 16 * trunk / gpus + gathered + ckpt,
        'frozen, FSDP2': 4 * p['trunk'] / gpus + 2 * blk * 2 + 16 * p['pyramid'] +
        batch * act['kept'],
    }
    return {k: v / GIB for k, v in out.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    print(f'Per-GPU memory of the trunk + simple pyramid (GiB, estimates), {args.gpus} GPUs, '
          f'batch {args.batch} per GPU, bf16 autocast, AdamW with fp32 master weights.\n')
    head = None
    for arch in args.arches:
        p = count_params(arch)
        for size in args.sizes:
            act = block_activations(arch, size)
            est = estimate(p, act, args.gpus, args.batch)
            if head is None:
                head = ['trunk', 'params', 'image', 'kept / block'] + list(est)
                print('| ' + ' | '.join(head) + ' |\n|' + '---|' * len(head))
            cells = [arch, f"{p['trunk'] / 1e9:.2f} B", f'{size}', f"{act['kept'] / 2**20:.0f} MiB"]
            print('| ' + ' | '.join(cells + [f'{v:.1f}' for v in est.values()]) + ' |',
                  flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())

"""Generate the synthetic "shapes" data (COCO instances + ADE20K-style semantic labels).

    python tools/make_shapes.py                      # data/shapes, 1000 train / 500 val, 128x128
    python tools/make_shapes.py data/tiny --num-train 8 --num-val 4 --size 64 96

The output is deterministic for a given set of arguments; see docs/datasets.md for the layout.
"""
import argparse
import json
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmvitswin.openmmlab.datasets.shapes import (DEFAULT_IMAGE_SIZE,  # noqa: E402
                                                  DEFAULT_NUM_TRAIN, DEFAULT_NUM_VAL,
                                                  DEFAULT_SEED, make_shapes)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out_dir', nargs='?', default='data/shapes',
                        help='output folder (default: data/shapes)')
    parser.add_argument('--num-train', type=int, default=DEFAULT_NUM_TRAIN,
                        help=f'training images (default {DEFAULT_NUM_TRAIN})')
    parser.add_argument('--num-val', type=int, default=DEFAULT_NUM_VAL,
                        help=f'validation images (default {DEFAULT_NUM_VAL})')
    parser.add_argument('--size', type=int, nargs='+', default=list(DEFAULT_IMAGE_SIZE),
                        metavar='N', help='image size: one value (square) or H W (default '
                        f'{DEFAULT_IMAGE_SIZE[0]} {DEFAULT_IMAGE_SIZE[1]})')
    parser.add_argument('--seed', type=int, default=DEFAULT_SEED,
                        help=f'random seed (default {DEFAULT_SEED})')
    parser.add_argument('--max-objects', type=int, default=5, help='shapes per image, at most')
    args = parser.parse_args(argv)
    if len(args.size) not in (1, 2):
        parser.error(f'--size takes one value or two (H W), got {len(args.size)}')
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    size = tuple(args.size) * (2 if len(args.size) == 1 else 1)
    try:
        summary = make_shapes(args.out_dir, num_train=args.num_train, num_val=args.num_val,
                              image_size=size, seed=args.seed, max_objects=args.max_objects)
    except (TypeError, ValueError) as exc:
        print(f'make_shapes: {exc}', file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2, default=list))
    return 0


if __name__ == '__main__':
    sys.exit(main())

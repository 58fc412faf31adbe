#!/usr/bin/env python
"""mmvitswin's benchmark (`make bench`): our backbones against mmdet's, timm's and HF's on the
same weights and inputs, interleaved. ``--help`` for the flags, docs/performance.md for the
rows, tools/bench for the code (``cli``: arguments and reports, then ``harness``, ``peers``)."""
import os
import sys

# oneDNN (torch's CPU kernels for bf16 matmuls, convolutions) keeps one primitive per op shape in
# a per-process cache of 1024 by default, where the variants of a case would evict each other's
# between the passes and a seen size rebuild them. Room for eight models; read at torch's start.
os.environ.setdefault('ONEDNN_PRIMITIVE_CACHE_CAPACITY', str(8 * 1024))
HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.dirname(HERE)):  # tools/bench, and mmvitswin from a checkout
    if path not in sys.path:
        sys.path.insert(0, path)

from bench.cli import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())

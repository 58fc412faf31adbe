#!/usr/bin/env python
"""The benchmark's entry point: ``python tools/benchmark.py --help`` (the package: tools/bench)."""
import os
import sys

# oneDNN (torch's CPU kernels for bf16 matmuls, convolutions) keeps one primitive per op shape in
# a per-process cache of 1024 by default. A user's process runs one model; the variants of a case
# share this one, and at the default they evict each other's primitives between the passes, so
# a seen size would rebuild them. Room for eight models' worth; read before torch builds one.
os.environ.setdefault('ONEDNN_PRIMITIVE_CACHE_CAPACITY', str(8 * 1024))
HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.dirname(HERE)):  # tools/bench, and mmvitswin from a checkout
    if path not in sys.path:
        sys.path.insert(0, path)

from bench.cli import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())

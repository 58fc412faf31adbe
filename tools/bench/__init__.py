"""mmvitswin's benchmark: speed and memory of our backbones against mmdet's, timm's and
HuggingFace's versions of the same models, on the same weights and inputs, interleaved.

    python tools/benchmark.py --preset standard --out-dir bench_out   # `make bench`
    python tools/benchmark.py --preset quick --out-dir /tmp/bq         # tiny models, ~1 min
    python tools/benchmark.py --preset rss                             # 300 new sizes
    python tools/benchmark.py --device cuda --dtype bf16 --skip compiled
    python tools/benchmark.py --count-kernels                          # meta device, no data
    python tools/benchmark.py --profile --profile-impls ours ref timm hf

- :mod:`.harness`: sizes, inputs, variants, interleaved timing, peak and resident memory;
- :mod:`.peers`: the peers and the exact mapping of our weights into them;
- ``presets/*.yaml``: the cases (``--cases FILE`` runs others of the same schema);
- :mod:`.profile`: ``--profile``, op groups, and on a GPU kernel launches, host syncs and the
  output against the CPU's;
- :mod:`.kernels`: ``--count-kernels``;
- :mod:`.cli`: arguments, reports.
"""

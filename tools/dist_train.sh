#!/usr/bin/env bash
# Multi-process training with torchrun: tools/dist_train.sh CONFIG NUM_PROCS [train.py args]
# One process per GPU with CUDA (NCCL); on a CPU-only machine the processes use gloo.
# Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), PORT (29500),
# PYTHON (the repo's .venv/bin/python when present, else python).
set -e
if [ $# -lt 2 ]; then
    echo "usage: $0 CONFIG NUM_PROCS [tools/train.py arguments]" >&2
    exit 2
fi
CONFIG=$1
NPROC=$2
HERE="$(cd "$(dirname "$0")" && pwd)"
if [ -z "$PYTHON" ]; then
    if [ -x "$HERE/../.venv/bin/python" ]; then PYTHON="$HERE/../.venv/bin/python"; else PYTHON=python; fi
fi
PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    --nproc_per_node="$NPROC" \
    "$HERE/train.py" "$CONFIG" --launcher pytorch "${@:3}"

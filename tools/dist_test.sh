#!/usr/bin/env bash
# Multi-process testing with torchrun: tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py args]
# Environment as tools/dist_train.sh (NNODES, NODE_RANK, MASTER_ADDR, PORT, PYTHON).
set -e
if [ $# -lt 3 ]; then
    echo "usage: $0 CONFIG CHECKPOINT NUM_PROCS [tools/test.py arguments]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
HERE="$(cd "$(dirname "$0")" && pwd)"
if [ -z "$PYTHON" ]; then
    if [ -x "$HERE/../.venv/bin/python" ]; then PYTHON="$HERE/../.venv/bin/python"; else PYTHON=python; fi
fi
PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    --nproc_per_node="$NPROC" \
    "$HERE/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"

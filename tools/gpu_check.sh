#!/usr/bin/env bash
# The GPU checks on a CUDA machine without network (the device tool's image: Python 3.12,
# torch with CUDA, nvcc, transformers, timm, no OpenMMLab packages).
#   PYTHON=.venv/bin/python tools/gpu_check.sh fetch
#       HERE, with network: wheels + mmcv's sdist into build/gpu_check/ (about 10 MiB; the
#       venv's python, because pip prepares mmcv's sdist metadata with torch + pkg_resources)
#   tools/gpu_check.sh
#       THERE, through the device tool with carry=["build/gpu_check"]; results under $OUT
#   tools/gpu_check.sh profile
#       THERE, nothing to carry (torch + transformers + timm only), a few minutes: the
#       benchmark's profile mode (tools/bench/profile.py) for SwinV2-T (ours and HF's, batch 2
#       at the recipe's sizes) and Swin-T (ours, timm's and HF's): op groups, kernel launches
#       and host syncs per call, the output against the CPU's; then the meta-device kernel count
# The full check installs the carried wheels into build/gpu_check/site, compiles mmcv 2.1.0
# with its CUDA ops for the local GPU only (a carried build/gpu_check replaces the folder there,
# so even a warm machine compiles again), then runs the AMP tests, a short `tools/train.py --amp`
# Mask R-CNN run on the demo config and `tools/benchmark.py --device cuda --dtype bf16`. Each
# step has a time limit inside a 585-second deadline; $OUT/summary.txt says which passed,
# $OUT/steps.log has the end of each step's output, $OUT/bench/ the benchmark's JSON and markdown.
set -u
cd "$(dirname "$0")/.."
DIR=build/gpu_check
PY=${PYTHON:-python3}

if [ "${1:-}" = profile ]; then
  OUT=${OUT:-$PWD/build/gpu_profile_out}
  export PYTHONUNBUFFERED=1
  timeout 200 $PY tools/benchmark.py --profile --device cuda --profile-model swinv2_t \
    --profile-impls ours ref --profile-batch 2 --count 3 --out-dir "$OUT/swinv2_t"
  timeout 150 $PY tools/benchmark.py --profile --device cuda --profile-model swin_t \
    --profile-impls ours timm hf --profile-scale 0.4 --count 3 --out-dir "$OUT/swin_t"
  timeout 120 $PY tools/benchmark.py --count-kernels --out-dir "$OUT"
  exit 0
fi

if [ "${1:-}" = fetch ]; then
  set -e
  mkdir -p "$DIR"
  # Not in the device image (KINDS.md lists it): OpenMMLab and its small dependencies, and a
  # setuptools that still has pkg_resources for mmcv's setup.py.
  $PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR" \
    mmengine==0.10.7 mmdet==3.3.0 mmsegmentation==1.2.2 addict yapf platformdirs termcolor \
    terminaltables pycocotools shapely prettytable wcwidth ftfy "setuptools<70"
  # pip runs mmcv's setup.py for the sdist's metadata: it needs torch and pkg_resources
  $PY -m pip install -q --no-deps --target "$DIR/host_setuptools" "$DIR"/setuptools-*.whl
  PYTHONPATH="$PWD/$DIR/host_setuptools" $PY -m pip download --no-deps --no-binary=:all: \
    --no-build-isolation -d "$DIR" mmcv==2.1.0
  rm -rf "$DIR/host_setuptools"
  du -sh "$DIR"
  exit 0
fi

OUT=${OUT:-$PWD/build/gpu_check_out}
mkdir -p "$OUT" "$DIR/site" "$DIR/logs"
export PYTHONPATH="$PWD/$DIR/site:$PWD" PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"  # at most 8 files come back: summary, steps.log, the benchmark's 2
: > "$SUMMARY"
: > "$OUT/steps.log"
step() {  # step NAME SECONDS COMMAND...: run within its limit and the 585-second deadline
  local name=$1 limit=$2 left=$((585 - SECONDS)) start=$SECONDS rc
  shift 2
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 10 ]; then
    echo "$name: skipped (out of time)" | tee -a "$SUMMARY"
    return 124
  fi
  timeout "$limit" "$@" > "$DIR/logs/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s (limit $limit s)" | tee -a "$SUMMARY"
  { echo "===== $name (exit $rc)"; tail -n 150 "$DIR/logs/$name.log"; } >> "$OUT/steps.log"
  return $rc
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -n 1
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } \
  >> "$SUMMARY" 2>&1

if ! $PY tools/check_mmcv_ops.py > /dev/null 2>&1; then
  step install 60 $PY -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target "$DIR/site" $(ls "$DIR"/*.whl) || exit 1
  # mmcv's ops against this torch and nvcc, for this GPU's architecture only (minutes, not an
  # hour); --no-build-isolation, or it silently builds without ops (DESIGN.md section 4).
  ARCH=$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
  step build_mmcv 420 env MMCV_WITH_OPS=1 FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$ARCH" \
    MAX_JOBS="$(nproc)" $PY -m pip install --no-index --no-deps --no-build-isolation \
    --no-cache-dir --target "$DIR/site" "$DIR"/mmcv-2.1.0.tar.gz || exit 1
fi
step check_mmcv_ops 30 $PY tools/check_mmcv_ops.py
step amp_tests 60 $PY -m pytest -q -p no:cacheprovider tests/test_amp_runner.py

# tools/train.py --amp (CUDA: MMEngine's AmpOptimWrapper, fp16 + dynamic loss scaling) on the
# Mask R-CNN demo config with a small generated data set: 20 iterations and one evaluation.
DATA=$PWD/$DIR/shapes
$PY -c "from mmvitswin.openmmlab.datasets import make_shapes; make_shapes('$DATA', 64, 8)" > /dev/null
cat > "$DIR/demo_amp.py" <<EOF
_base_ = '$PWD/configs/demo/mask_rcnn_swin_nano_shapes.py'
_loader = dict(num_workers=2, persistent_workers=False, dataset=dict(data_root='$DATA/coco/'))
train_dataloader = _loader
val_dataloader = _loader
test_dataloader = _loader
val_evaluator = dict(ann_file='$DATA/coco/annotations/instances_val.json')
test_evaluator = val_evaluator
default_hooks = dict(logger=dict(interval=5))
EOF
step train_amp 60 $PY tools/train.py "$DIR/demo_amp.py" --amp --work-dir "$DIR/work" \
  --cfg-options train_cfg.max_iters=20 train_cfg.val_interval=20
grep -h "precision\|AmpOptimWrapper\|Iter(train) \[20/20\]\|bbox_mAP:" \
  "$DIR/logs/train_amp.log" >> "$SUMMARY"

# compiled rows left out: their compilation alone would take the step's time
step benchmark 200 $PY tools/benchmark.py --device cuda --dtype bf16 --skip compiled \
  --out-dir "$OUT/bench"
cat "$SUMMARY"

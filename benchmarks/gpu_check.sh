#!/usr/bin/env bash
# One command that exercises every GPU path of atlas_fast and prints one table (a few minutes on one GPU; < 8 min;
# --skip-demo leaves out the longest check):
#
#     bash benchmarks/gpu_check.sh                      # with atlas_fast's dependencies installed
#     bash benchmarks/gpu_check.sh --wheels DIR         # offline machine with torch only: install the rest from DIR
#
# It first lists which dependencies this Python lacks. With --wheels DIR (wheel files, e.g. made elsewhere with
# `pip download open_clip_torch h5py faiss-cpu ftfy regex wcwidth tqdm --no-deps --only-binary=:all: --python-version X.Y
# -d DIR`, several Python versions may lie side by side) the wheels that fit this Python are installed from DIR only
# (no network, no dependency resolution) into ./.gpu_check_env, a folder added to PYTHONPATH for this script;
# without it the script says what is missing and stops. Then benchmarks/gpu_check.py runs the checks: cache build
# under fp16 autocast (features/s of the build, its encoding and its view cutting; Table III's
# 7.1 M features at that rate), faiss on the GPU if the installed faiss has GPU support, cached training with AMP,
# R-batched training, a pixel-path method when this version has one, benchmarks/step_speed.py on CUDA (shared
# prefix and fused attention vs open_clip's blocks), eager vs CUDA-graph cached CoOp steps (graph_steps) at
# C = 10/50/500, runs/hour at R = 1/4/12 under AMP, the demo's wall time and
# benchmarks/paper_scale.py within --paper-scale-budget seconds (Table III priced at its real shapes), and the
# cached vs pixel training steps of CLIP-LoRA, TCP and KDPL (benchmarks/beyond_methods.py, KDPL's ViT-H-14 teacher).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
WHEELS=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "MISSING: torch is not importable by $PYTHON; install torch with CUDA support first." >&2
  exit 2
fi

# module name -> pip distribution (what atlas_fast imports)
check_missing() {
  "$PYTHON" - <<'EOF'
import importlib.util
# what the checks import (matplotlib and scipy are only needed for plots and are not checked)
needed = {"open_clip": "open_clip_torch", "ftfy": "ftfy", "regex": "regex", "h5py": "h5py", "faiss": "faiss-cpu",
          "numpy": "numpy", "tqdm": "tqdm", "PIL": "pillow", "torchvision": "torchvision"}
print(" ".join(dist for module, dist in needed.items() if importlib.util.find_spec(module) is None))
EOF
}

MISSING=$(check_missing)
if [ -n "$MISSING" ] && [ -n "$WHEELS" ]; then
  echo "missing: $MISSING; installing the wheels of $WHEELS that fit this Python (no network, no dependencies)"
  for wheel in "$WHEELS"/*.whl; do
    "$PYTHON" -m pip install -q --no-index --no-deps --upgrade --target .gpu_check_env "$wheel" 2>/dev/null \
      || echo "  skipped $(basename "$wheel") (not for this Python/platform)"
  done
  export PYTHONPATH="$PWD/.gpu_check_env${PYTHONPATH:+:$PYTHONPATH}"
  MISSING=$(check_missing)
fi
"$PYTHON" - <<'EOF'
import torch
ok = torch.cuda.is_available()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device: "
      f"{torch.cuda.get_device_name(0) if ok else 'NONE VISIBLE'}")
if ok:  # the GPU itself works: an fp16 matmul agrees with fp32
    a = torch.randn(2048, 2048, device="cuda")
    err = ((a.half() @ a.half()).float() - a @ a).abs().max().item() / (a @ a).abs().max().item()
    print(f"fp16 matmul relative error vs fp32: {err:.1e}")
EOF
if [ -n "$MISSING" ]; then
  echo ""
  echo "| check | status | measured | note |"
  echo "|---|---|---|---|"
  for dist in $MISSING; do
    echo "| dependency $dist | MISSING | - | pip install $dist, or carry its wheel: --wheels DIR |"
  done
  echo ""
  echo "MISSING: $MISSING -- atlas_fast cannot run its GPU paths without them; nothing else was checked." >&2
  exit 2
fi
exec "$PYTHON" benchmarks/gpu_check.py "${ARGS[@]}"

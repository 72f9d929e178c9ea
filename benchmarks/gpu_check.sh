#!/usr/bin/env bash
# One command for a GPU's first contact with atlas_fast, then its prices: under 8 minutes on one H100/H200, one table.
#
#     bash benchmarks/gpu_check.sh                      # with atlas_fast's dependencies installed
#     bash benchmarks/gpu_check.sh --wheels DIR         # offline machine with torch only: install the rest from DIR
#     bash benchmarks/gpu_check.sh --smoke              # no GPU: the same script on the CPU, tiny model (a smoke test)
#     bash benchmarks/gpu_check.sh --help               # this text and gpu_check.py's options; runs nothing
#
# It first lists which dependencies this Python lacks. With --wheels DIR (wheel files, e.g. made elsewhere with
# `pip download open_clip_torch h5py faiss-cpu ftfy regex wcwidth tqdm --no-deps --only-binary=:all: --python-version X.Y
# -d DIR`, several Python versions may lie side by side) the wheels that fit this Python are installed from DIR only
# (no network, no dependency resolution) into ./.gpu_check_env, a folder added to PYTHONPATH for this script;
# without it the script says what is missing and stops. Then, in this order:
#
# 1. `atlas-fast doctor` (about a minute): versions, device, graphed against eager steps of CoOp, CoCoOp, IVLP and
#    TCP with their host traffic and reserved memory, the memory plan's R, faiss;
# 2. the first-contact block of benchmarks/gpu_check.py (planned under 4 minutes): every hazard of a first run on a
#    real GPU: a pixel group through the real loader with workers and pinned memory, CLIP-LoRA graphed, PromptSRC
#    with unequal run sizes, per-epoch evaluation under graphs, an injected overflow against torch's own GradScaler,
#    reserved memory against the plan on a partial batch; any fallback to eager steps is a FAIL;
# 3. the pricing block (the rest of gpu_check.py: cache build, AMP, batching, step speed, graphed against eager steps
#    of every method, runs/hour, the demo, Table III priced, ...) within what is left of 8 minutes: a check that
#    would not fit is skipped with a row saying so.
#
# Exit status: 0 when nothing failed, 1 when a row failed (the doctor's or gpu_check.py's), 2 when something is
# missing. Options other than --wheels and --smoke go to gpu_check.py (e.g. --skip-demo, --block first-contact).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
WHEELS=""
SMOKE=""
HELP=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    -h|--help) HELP=1; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # atlas_fast from this checkout, installed or not
if [ -n "$HELP" ]; then  # what the script does and its options; nothing is checked or run
  sed -n '2,/^set -uo pipefail/p' benchmarks/gpu_check.sh | sed -e '$d' -e 's/^# \{0,1\}//'
  echo ""
  "$PYTHON" benchmarks/gpu_check.py --help 2>/dev/null \
    || echo "(python benchmarks/gpu_check.py --help lists the options passed on to it; it needs torch)"
  exit 0
fi
START=$SECONDS

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

if [ -n "$SMOKE" ]; then
  DOCTOR=(--device cpu)
  CHECK=(--device cpu --model atlas-tiny --scale 0.1 --skip-demo --paper-scale-budget 0)
  TOTAL=${GPU_CHECK_SMOKE_BUDGET:-150}
else
  DOCTOR=()
  CHECK=()
  TOTAL=450  # seconds for the doctor and gpu_check.py together: the whole script under 8 minutes
fi
echo ""
echo "== 1. atlas-fast doctor"
"$PYTHON" -m atlas_fast.cli doctor "${DOCTOR[@]}"
DOCTOR_STATUS=$?
BUDGET=$(( TOTAL - (SECONDS - START) ))
if [ "$BUDGET" -lt 60 ]; then BUDGET=60; fi
echo ""
echo "== 2-3. first contact, then prices (gpu_check.py, $BUDGET s budget; the doctor took $(( SECONDS - START )) s)"
"$PYTHON" benchmarks/gpu_check.py "${CHECK[@]}" --budget-s "$BUDGET" "${ARGS[@]}"
CHECK_STATUS=$?
echo ""
echo "gpu_check.sh: $(( SECONDS - START )) s in all; doctor exit $DOCTOR_STATUS, gpu_check.py exit $CHECK_STATUS"
if [ "$DOCTOR_STATUS" -ne 0 ] || [ "$CHECK_STATUS" -ne 0 ]; then exit 1; fi
exit 0

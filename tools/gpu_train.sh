#!/usr/bin/env bash
# Train (or resume) the mini Kolibri target, then its block drafter, on one GPU within a time
# budget, and pack the exported checkpoints into $OUT (parts of < 16 MiB each, as the device
# tool brings back at most 8 files of 16 MiB). Run from the repository root of the GPU machine:
#
#   bash tools/gpu_train.sh        (device run: carry corpus/train.jsonl.xz,
#                                   corpus/valid.jsonl.xz and corpus/tokenizer; add
#                                   runs/target/export to skip a finished target)
#
# Typical use: two device runs (timeout_s 600), each ~8 min of training:
#   run 1: bash tools/gpu_train.sh  -> target, 5,000 steps of 64 x 1,024 tokens (~330M tokens:
#          ~20 s setup, ~2 min compilation, ~4.5 min at ~1.2M tokens/s); the drafter is
#          skipped when less than DRAFTER_START_S is left
#   run 2: bash tools/gpu_train.sh  -> drafter, 7,000 steps of 16 x 1,024 windows (~115M
#          tokens at ~0.3M tokens/s, ~6.5 min). If the machine went cold in between (it
#          stays warm 30 s), unpack run 1's parts here and carry runs/target/export too.
# Both in one run: DRAFTER_MIN_S=220 TARGET_ARGS="--steps 2000" DRAFTER_ARGS="--steps 2500"
#
# Environment (all optional):
#   BUDGET_S=540          seconds for this whole call (training stops, saves and exports
#                         before it; keep it below the run's timeout)
#   DRAFTER_MIN_S=0       seconds kept for the drafter while the target still trains
#   DRAFTER_START_S=150   the drafter starts only with more than this left (setup ~30 s and
#                         compilation ~40 s come first)
#   COMPILE=1             torch.compile the losses (target ~2 min, drafter ~40 s; then
#                         ~2.3x faster)
#   TARGET_ARGS, DRAFTER_ARGS   extra options of tools/train_target.py / train_drafter.py
#   PACK_ITEMS            what is packed, under runs/ (default: both exports, logs, vocab)
# Fine-tuning the shipped drafter (the target's export taken as it is, no state: not trained):
#   mkdir -p runs/target && cp -r checkpoints/kolibri-mini/target runs/target/export &&
#   BUDGET_S=330 PACK_ITEMS="drafter/export drafter/log.jsonl" DRAFTER_ARGS="--init-from
#   checkpoints/kolibri-mini/drafter --copy-miss-weight 2 --lr 2e-4 --steps 1500 --warmup 50"
#   bash tools/gpu_train.sh
#   OUT=runs/out          where the packed results go (the device tool sets it)
# State: runs/target/state and runs/drafter/state (git-ignored) stay on a warm machine, so a
# second call resumes exactly; a finished target's export (runs/target/export with
# training_steps >= the run's --steps, or carried in without a state) is reused. Back here:
#   cat <files_at>/kolibri-mini.tar.part* | tar -x -C runs     -> runs/target/export, runs/drafter/export
#   python build.py --target cpu --weights bf16 --model runs/target/export \
#       --drafter runs/drafter/export --out engines/mini --force
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
BUDGET_S=${BUDGET_S:-540}
DRAFTER_MIN_S=${DRAFTER_MIN_S:-0}
DRAFTER_START_S=${DRAFTER_START_S:-150}
COMPILE=${COMPILE:-1}
CFLAG=$([ "$COMPILE" = 1 ] && echo --compile || true)
OUT=${OUT:-runs/out}
mkdir -p "$OUT" runs
LOG="$OUT/train.log"
T0=$(date +%s)
RC=0   # a failed trainer still lets what exists be packed; the script then exits with its code
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
py() { python3 "$@" 2>&1 | tee -a "$LOG"; }

python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
  'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())" | tee -a "$LOG"
for f in corpus/train.jsonl.xz corpus/valid.jsonl.xz corpus/tokenizer/tokenizer.json; do
  [ -f "$f" ] || { echo "missing $f: carry it (see the header)" | tee -a "$LOG"; exit 2; }
done

target_done() {  # the export exists and holds the run's last step (or came without a state)
  python3 - "$@" <<'EOF'
import json, pathlib, sys
cfg = pathlib.Path("runs/target/export/config.json")
state = pathlib.Path("runs/target/state/state.json")
done = cfg.is_file() and (not state.is_file() or json.loads(cfg.read_text()).get(
    "training_steps", -1) >= json.loads(state.read_text()).get("steps_total", 1 << 60))
sys.exit(0 if done else 1)
EOF
}

if target_done; then
  echo "target: export found, not training it" | tee -a "$LOG"
else
  TB=$(( $(left) - DRAFTER_MIN_S ))
  # shellcheck disable=SC2086
  py tools/train_target.py --corpus corpus --tokenizer corpus/tokenizer --run-dir runs/target \
    --out runs/target/export --time-budget-s "$TB" --export-every-call $CFLAG ${TARGET_ARGS:-} \
    || RC=$?
fi

if target_done && [ "$(left)" -gt "$DRAFTER_START_S" ]; then
  # shellcheck disable=SC2086
  py tools/train_drafter.py --corpus corpus --target runs/target/export \
    --run-dir runs/drafter --out runs/drafter/export --time-budget-s "$(( $(left) - 25 ))" \
    --export-every-call $CFLAG ${DRAFTER_ARGS:-} || RC=$?
fi

PACK=()
for d in ${PACK_ITEMS:-target/export drafter/export target/log.jsonl drafter/log.jsonl \
    drafter/draft_vocab.json}; do
  if [ -e "runs/$d" ]; then PACK+=("$d"); fi
done
if [ "${#PACK[@]}" -gt 0 ]; then
  tar -C runs -cf - "${PACK[@]}" | split -b 15m -d - "$OUT/kolibri-mini.tar.part"
fi
ls -la "$OUT" | tee -a "$LOG"
echo "done in $(( $(date +%s) - T0 )) s, status $RC" | tee -a "$LOG"
exit "$RC"

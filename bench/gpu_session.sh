#!/usr/bin/env bash
# One H200 device call per part: check and time what changed in the kernel path since the last
# H200 run (bench/results/h200-2026-11-30/). Each step runs under its own timeout and writes its
# log and JSON under $OUT, so a failing step does not cost the others. Run from the repository
# root on the GPU machine. The parts of earlier sessions (c-v, w, y, z, za-zn, zr) were removed once
# their results were written up: each results README (bench/results/*/README.md) names the commit
# whose bench/gpu_session.sh holds the part it ran.
#
#   PART=a bash bench/gpu_session.sh   correctness (~5 min): the fused norm/RoPE kernels and the
#       split-K option against their references (graphs replayed twice), the runtime's graph =
#       eager = unpadded bits and lossless modes with the pinned metadata upload, the drafter
#       round's parity, graphs and host/device split.          carry: engines/carry-a.tar.xz
#   PART=b bash bench/gpu_session.sh   speed (~8 min): full-size decode / verify / profile, the
#       trained default's acceptance and tokens/s per speculative mode (again with the opt-in
#       ring-attention kernel and fused sampler), a host/device profile.
#                                                               carry: engines/carry-b.tar.xz
#   PART=zo bash bench/gpu_session.sh   when is a target graph's replay() slow on the host:
#       bench/replay_probe.py in three processes (copy alone, copy+drafter alone, copy then
#       copy+drafter then copy) (~5 min).                      carry: engines/carry-b.tar.xz
#   PART=zp bash bench/gpu_session.sh   profile_generate's timed split without the profiler
#       (--profiler off: a profiler run slows the process's later CUDA calls), copy and
#       copy+drafter each in its own process, twice; then bench/moe_pipeline.py (BLOCK_K 128 /
#       256, stages 3 / 4) and gpu_check moe (~8 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=zq bash bench/gpu_session.sh   the timed split with parts by step kind (copy,
#       copy+drafter, own processes), gpu_check moe and plugins.py's MoE rows on BLOCK_K 128,
#       the in-process chat + German eval (6 prompts each, greedy, medians of 2) (~9 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=zs bash bench/gpu_session.sh   chained drafter rounds (spec/drafter_chain.py, graphs
#       captured at start-up): gpu_runtime (every mode == off, chained and unchained), the
#       timed split of copy+drafter chained and unchained (own processes), the in-process chat
#       + German eval with 8 prompts each, medians of 3 (~8 min). (PART zr, the same at
#       a8f00d8 with 6 prompts, left out.)                      carry: engines/carry-b.tar.xz
#   PART=zt bash bench/gpu_session.sh   chained rounds in PART ze's eval (chat and German,
#       greedy, one engine per process, 4 processes per mode), then the in-process eval at
#       T = 0.8 (~8 min).                                        carry: engines/carry-b.tar.xz
#   PART=zv bash bench/gpu_session.sh   every graph replayed once at start-up (its upload):
#       gpu_runtime on 2 prompts, 24 tokens (capture_all leaves the cache untouched, every
#       mode == off), then PART zt's isolated eval (~7 min).   carry: engines/carry-b.tar.xz
#   PART=zu bash bench/gpu_session.sh   the README's acceptance table (every category, 4
#       prompts + 4 HumanEval, greedy and T = 0.8, medians of 3) (~4 min).
#                                                               carry: engines/carry-b.tar.xz
#
# The tracked tree (43 MB with checkpoints/) plus a carry must stay under 64 MiB, so the engines
# travel as xz archives (the two gpu-small engines share most bytes: 12.6 MB together), made here:
#   python bench/gpu_runtime.py --make-engines engines/gpu-small
#   tar -C engines -cf - gpu-small/engine-fp8-nvfp4-hadamard-int4 gpu-small/engine-fp8-nvfp4-fp8 \
#       gpu-small/spec_bench_question.jsonl | xz -9 > engines/carry-a.tar.xz
#   python build.py --target h200 --force --out engines/mini-h200
#   mkdir -p engines/prompts && cp ../shared/data/prompts/* engines/prompts/
#   tar -C engines -cf - mini-h200 prompts | xz -9 > engines/carry-b.tar.xz
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu-session}
mkdir -p "$OUT"
FAILED=()

step() {  # step NAME SECONDS COMMAND...: run under a timeout, log to $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s)"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "== $name: rc $rc in $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || FAILED+=("$name")
}

evalmini() {  # evalmini NAME SECONDS ARGS...: the acceptance eval on the trained default
  local name=$1 limit=$2   # (or on $ENGINE)
  shift 2
  step "$name" "$limit" python3 tools/eval_acceptance.py --engine "${ENGINE:-engines/mini-h200}" \
    --prompts-dir engines/prompts --device cuda "$@"
}

shorteval() {  # shorteval NAME SECONDS ARGS...: the short acceptance eval (greedy, 2 prompts
  local name=$1 limit=$2   # per category, no HumanEval, 128 tokens, medians of 2)
  shift 2
  evalmini "$name" "$limit" --per-category 2 --humaneval 0 --max-tokens 128 --repeats 2 \
    --temperatures 0 "$@"
}

minichecks() {  # minichecks RUNTIME_S DRAFTER_S CHECK...: gpu_runtime (every mode == off) and
  # gpu_drafter --only CHECK... on the trained default, with the Spec-Bench prompts
  local rt=$1 dr=$2 P=engines/prompts/spec_bench_question.jsonl
  shift 2
  step runtime "$rt" python3 bench/gpu_runtime.py --engine engines/mini-h200 --out "$OUT" \
    --prompts-file "$P"
  step drafter "$dr" python3 bench/gpu_drafter.py --engine engines/mini-h200 --out "$OUT" \
    --prompts-file "$P" --only "$@"
}

pack() {  # pack NAME: every file under $OUT into $OUT/NAME_results.tar.gz (the device machine
  # returns a limited number of files per call)
  tar -C "$OUT" -czf "/tmp/$1_results.tar.gz" . && rm -rf "${OUT:?}"/* && \
    mv "/tmp/$1_results.tar.gz" "$OUT/"
}

unpack() {  # unpack engines/NAME.tar.xz into engines/ when it was carried
  [ -f "engines/$1.tar.xz" ] || return 0
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('engines', filter='data')" \
    "engines/$1.tar.xz" && echo "unpacked engines/$1.tar.xz"
}

case "${PART:-}" in
  a)
    unpack carry-a
    step kernels 150 python3 bench/gpu_check.py --only norm,qknorm,fp8gemv,moe,splitk
    step runtime 230 python3 bench/gpu_runtime.py --engines engines/gpu-small --out "$OUT" \
      --prompts-file engines/gpu-small/spec_bench_question.jsonl
    step drafter 120 python3 bench/gpu_drafter.py --engines engines/gpu-small --out "$OUT" \
      --prompts-file engines/gpu-small/spec_bench_question.jsonl --only parity graphs round
    ;;
  zo)
    unpack carry-b
    for m in "copy" "copy+drafter" "copy copy+drafter copy"; do
      n=${m// /_}
      # shellcheck disable=SC2086  # $m: one or more modes
      step "probe_${n//+/_}" 160 python3 bench/replay_probe.py --engine engines/mini-h200 \
        --modes $m --out "$OUT/${n//+/_}"
    done
    ;;
  zp)
    unpack carry-b
    for i in 1 2; do
      for m in copy copy+drafter; do
        n=split_${m//+/_}_$i
        step "$n" 75 python3 bench/profile_generate.py --engine engines/mini-h200 \
          --prompts-file engines/prompts/spec_bench_question.jsonl --modes "$m" \
          --max-tokens 192 --warm-runs 1 --profiler off --out "$OUT/$n"
      done
    done
    step moe_pipeline 200 python3 bench/moe_pipeline.py --out "$OUT"
    step moe_check 90 python3 bench/gpu_check.py --only moe
    ;;
  zq)
    unpack carry-b
    for m in copy copy+drafter; do
      n=split_${m//+/_}
      step "$n" 75 python3 bench/profile_generate.py --engine engines/mini-h200 \
        --prompts-file engines/prompts/spec_bench_question.jsonl --modes "$m" \
        --max-tokens 192 --warm-runs 1 --profiler off --out "$OUT/$n"
    done
    step moe_check 90 python3 bench/gpu_check.py --only moe
    step plugins_moe 90 python3 bench/plugins.py --only moe
    evalmini inproc 220 --categories mt_bench translation --per-category 6 --humaneval 0 \
      --max-tokens 192 --repeats 2 --temperatures 0 --json "$OUT/eval_inproc.json"
    pack zq
    ;;
  zs)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step runtime 230 python3 bench/gpu_runtime.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P"
    for c in on off; do
      step "split_chain_$c" 60 python3 bench/profile_generate.py --engine engines/mini-h200 \
        --prompts-file "$P" --modes copy+drafter --max-tokens 192 --warm-runs 1 \
        --profiler off --drafter-chain "$c" --out "$OUT/split_chain_$c"
    done
    evalmini inproc 150 --categories mt_bench translation --per-category 8 --humaneval 0 \
      --max-tokens 192 --repeats 3 --temperatures 0 --json "$OUT/eval_inproc.json"
    pack zs
    ;;
  zt)
    unpack carry-b
    E=(--categories mt_bench translation --per-category 4 --humaneval 0 --max-tokens 192
       --repeats 2)
    evalmini isolated 270 "${E[@]}" --temperatures 0 --isolated 4 \
      --json "$OUT/eval_isolated.json"
    evalmini sampled 150 "${E[@]}" --temperatures 0.8 --json "$OUT/eval_sampled.json"
    pack zt
    ;;
  zv)
    unpack carry-b
    step runtime 190 python3 bench/gpu_runtime.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file engines/prompts/spec_bench_question.jsonl --limit 2 --max-tokens 24
    evalmini isolated 190 --categories mt_bench translation --per-category 4 --humaneval 0 \
      --max-tokens 192 --repeats 2 --temperatures 0 --isolated 4 \
      --json "$OUT/eval_isolated.json"
    pack zv
    ;;
  zu)
    unpack carry-b
    evalmini acceptance 280 --per-category 4 --humaneval 4 --max-tokens 192 --repeats 3 \
      --json "$OUT/eval_h200.json"
    pack zu
    ;;
  b)
    unpack carry-b
    step fullsize 200 python3 bench/fullsize.py --out "$OUT" --parts decode,verify,profile \
      --budget 180
    evalmini acceptance 170 --per-category 2 --humaneval 2 \
      --max-tokens 128 --json "$OUT/eval_h200.json"
    evalmini acceptance_opt 120 --per-category 2 --humaneval 2 \
      --max-tokens 128 --drafter-attention kernel --json "$OUT/eval_opt.json"
    step profile 100 python3 bench/profile_generate.py --engine engines/mini-h200 --device cuda \
      --prompts-file engines/prompts/spec_bench_question.jsonl --out "$OUT"
    ;;
  *)
    echo "PART must be one of the parts the header lists" >&2
    exit 2
    ;;
esac
echo "failed steps: ${FAILED[*]:-none}"
[ "${#FAILED[@]}" = 0 ]

#!/usr/bin/env bash
# One H200 device call per part: check and time what changed in the kernel path since the last
# H200 run (bench/results/h200-2026-11-30/). Each step runs under its own timeout and writes its
# log and JSON under $OUT, so a failing step does not cost the others. Run from the repository
# root on the GPU machine. The parts of earlier sessions (c-v, w, y, z, za-zv, the k*, l*, m*,
# n* parts, oa, od, oe, of, oh-ok, pa-pd, qa, rs, rt, ia, ab, gp, wg, wf, fw, wl, wp, wr, wq,
# ms, ss, pd again (2026-12-07), kp (2026-12-08) and cc, fz, gb, gk, st, tr, zu) were removed
# once their results were written up: each results README (bench/results/*/README.md) names
# the commit whose bench/gpu_session.sh holds the part it ran.
#
#   PART=gw bash bench/gpu_session.sh   an FP8 GEMV on wgmma at every row count, in Gluon
#       (bench/gluon_gemv_probe.py: weights in storage order, cp.async ring, decoded weights
#       as wgmma's register A): error against fp8_gemv_ref, batch invariance, µs at 1-144
#       rows against fp8_gemv (QKV, o_proj; 10 (SPLIT, BK, ASYNC, STAGES, FIXUP) settings) (~1 min).
#   PART=gn bash bench/gpu_session.sh   the same for the NVFP4 heads (bench/gluon_nvfp4_probe.py,
#       LM head and drafter head against nvfp4_gemv; 4 (SPLIT, ASYNC, STAGES) settings) (~1 min).
#   PART=pf bash bench/gpu_session.sh   L2 prefetches, off by default: the MoE's experts from the
#       top-k kernel (moe_route.PREFETCH_TOKENS / PREFETCH) and the next layer's QKV weight from
#       the MoE's combine (moe.PREFETCH_NEXT_TOKENS). gpu_check moepf (the bits of off, graphs
#       replayed twice), moe_forward at 1 / 2 / 4 tokens off / gate-up / gate-up + down /
#       down / off (bench/moe_chunks.py --variants prefetch), whole decode steps off, PREFETCH 2
#       at one token (41 MB), PREFETCH 3 up to 2 tokens (26 MB), the next QKV at one token,
#       both at one token, off again (the step limits add up to 555 s; ~8 min).
#   PART=hx bash bench/gpu_session.sh   INT4 against FP8 attention (bench/plugins.py --only attn,
#       16- and 64-token pages, B = 1-64 at 4k / 32k / 128k), then whole decode steps at 1k /
#       8k / 32k with the stream counts whose cache fits (an H100 holds 1-16 at 32k) (~6 min).
#   PART=fc bash bench/gpu_session.sh   final checks at the session's defaults: gpu_check of every
#       kernel (split-K too), gpu_runtime on the trained default (head "auto", QKV / o_proj
#       mma.sync, ONE_LAUNCH_ROWS 64) (~8 min).                   carry: engines/carry-b.tar.xz
#   PART=a bash bench/gpu_session.sh   correctness (~5 min): the fused norm/RoPE kernels and the
#       split-K option against their references (graphs replayed twice), the runtime's graph =
#       eager = unpadded bits and lossless modes with the pinned metadata upload, the drafter
#       round's parity, graphs and host/device split.          carry: engines/carry-a.tar.xz
#   PART=b bash bench/gpu_session.sh   speed (~8 min): full-size decode / verify / profile, the
#       trained default's acceptance and tokens/s per speculative mode (again with the opt-in
#       ring-attention kernel and fused sampler), a host/device profile.
#                                                               carry: engines/carry-b.tar.xz
#   PART=sd bash bench/gpu_session.sh   self-distillation of the block drafter (~9 min): the
#       target's greedy continuations of corpus prompts (tools/gen_self_distill.py, copy mode,
#       64 streams, ~170 s), then the shipped drafter fine-tuned on 3/4 of them and 1/4 corpus
#       (tools/train_drafter.py --init-from --generated); $OUT gets the drafter export, the
#       training log and the generated stream (xz). GEN_SEED (prompts, default 0) and
#       MISS_WEIGHT (--copy-miss-weight, default 1) vary a second round; --init-from is the
#       shipped drafter, whatever it is at the call's commit.
#       carry: engines/carry-sd.tar.xz corpus/sub, made here:
#   tar -C engines -cf - mini-h200/target mini-h200/manifest.json | xz -9 > engines/carry-sd.tar.xz
#   python tools/corpus_subset.py --fraction 0.2 --out corpus/sub   (the tree + carry < 64 MiB)
#   PART=se bash bench/gpu_session.sh   the self-distilled drafter (PART sd) in engines/mini-h200-sd:
#       the timed split with the evals' decode time (copy, copy+drafter, own processes, chat +
#       German, 4 prompts each), the in-process chat + German eval (8 prompts each, greedy,
#       medians of 3) (~7 min).                                 carry: engines/carry-se.tar.xz
#   python build.py --target h200 --model checkpoints/kolibri-mini/target \
#       --drafter runs/sd/drafter/export --out engines/mini-h200-sd
#   tar -C engines -cf - mini-h200-sd prompts | xz -9 > engines/carry-se.tar.xz
#   PART=hp bash bench/gpu_session.sh   host time function by function (bench/host_profile.py,
#       cProfile) of copy and copy+drafter on engines/mini-h200-sd, own processes, German and
#       chat, 4 prompts each, 192 tokens (~2 min).                carry: engines/carry-se.tar.xz
#   PART=fe bash bench/gpu_session.sh   the shipped drafter's final figures: the in-process chat +
#       German eval (8 prompts each, greedy, medians of 3; then T = 0.8, 4 prompts, medians of
#       2), PART zu's README table, then one engine per process (--isolated 4, 4 prompts
#       each, greedy) (~9 min).                                  carry: engines/carry-b.tar.xz
#   PART=sp bash bench/gpu_session.sh   PART se's timed split on the shipped engine, with the
#       rest of the step timed too (commit, the engine's observe, taps rows, chain items)
#       (~2 min).                                                carry: engines/carry-b.tar.xz
#   PART=ga bash bench/gpu_session.sh   the drafter gate with chained rounds and the shipped
#       drafter: the in-process chat + German eval (8 prompts, greedy and T = 0.8, medians of
#       2) with --drafter-gate always, then adaptive; compare each run's copy+drafter / copy
#       ratio (copy is the same in both, the processes' host speeds are not) (~4 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=ps bash bench/gpu_session.sh   copy and copy+drafter's step parts in one process, the
#       modes taking turns (bench/paired_split.py, 4 rounds, chat + German, 4 prompts each):
#       which parts make copy+drafter's steps dearer, free of the per-process host speed
#       (~3 min).                                                carry: engines/carry-b.tar.xz
#   PART=tl bash bench/gpu_session.sh   copy and copy+drafter's steps on the GPU's clock
#       (bench/gpu_timeline.py: CUDA events, no profiler; German, then chat, 4 prompts, 2
#       rounds): whether the drafter's rounds or the host set a step's pace; then PART ps
#       (~6 min).                                                 carry: engines/carry-b.tar.xz
#   PART=tc bash bench/gpu_session.sh   the chained round's index columns in one kernel
#       (plugins/chain_index.py): gpu_check chainindex (+ the drafter's other kernels), PART
#       tl's timeline and paired split, the in-process chat + German eval (8 prompts greedy,
#       medians of 3; 4 prompts T = 0.8, medians of 2) (~6 min).  carry: engines/carry-b.tar.xz
#   PART=ob bash bench/gpu_session.sh   (~9 min, engine carry-b) final checks after kernel changes:
#       gpu_check of every kernel, the trained default's gpu_runtime and gpu_drafter graphs,
#       whole decode and verify steps under the default PDL
#   PART=og bash bench/gpu_session.sh   (~2 min, no engine) the MoE's n-tiles past 64 tokens and K
#       split at 1-4 tokens (bench/moe_chunks.py --variants tiles, bits against the defaults)
#   PART=nr bash bench/gpu_session.sh   (~5 min, no engine) Nsight Compute on the MoE experts at
#       one token and at 256 (units by expert), the NVFP4 LM head at one row, fp8_gemv QKV at 1
#       and 64 rows (swapped, 32-row tiles)
#
# The tracked tree (43 MB with checkpoints/) plus a carry must stay under 64 MiB, so the engines
# travel as xz archives (the two gpu-small engines share most bytes: 12.6 MB together), made here:
#   python bench/gpu_runtime.py --make-engines engines/gpu-small
#   tar -C engines -cf - gpu-small/engine-fp8-nvfp4-hadamard-int4 gpu-small/engine-fp8-nvfp4-fp8 \
#       gpu-small/spec_bench_question.jsonl | xz -9 > engines/carry-a.tar.xz
#   python build.py --target h200 --force --out engines/mini-h200
#   mkdir -p engines/prompts && cp ../shared/data/prompts/* engines/prompts/
#   python bench/carry_engine.py pack engines/mini-h200 engines/carry-b.tar.xz \
#       --extra engines/prompts
# (carry_engine.py leaves out the tensors the tracked checkpoints/kolibri-mini holds byte for
# byte, 18.0 -> 12.2 MiB; `unpack` below puts them back after checking their SHA-256.)
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

minichecks() {  # minichecks RUNTIME_S DRAFTER_S CHECK...: gpu_runtime (every mode == off) and
  # gpu_drafter --only CHECK... on the trained default, with the Spec-Bench prompts
  local rt=$1 dr=$2 P=engines/prompts/spec_bench_question.jsonl
  shift 2
  step runtime "$rt" python3 bench/gpu_runtime.py --engine engines/mini-h200 --out "$OUT" \
    --prompts-file "$P"
  step drafter "$dr" python3 bench/gpu_drafter.py --engine engines/mini-h200 --out "$OUT" \
    --prompts-file "$P" --only "$@"
}

timeline() {  # timeline SECONDS: bench/gpu_timeline.py (German, then chat, 4 prompts, 2
  # rounds), then bench/paired_split.py (chat + German, 4 prompts, 4 rounds), copy against
  # copy+drafter, on the trained default
  local c P=engines/prompts/spec_bench_question.jsonl
  for c in translation mt_bench; do
    step "timeline_$c" "$1" python3 bench/gpu_timeline.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --categories "$c" --per-category 4 \
      --max-tokens 192 --warm-runs 1 --rounds 2 --out "$OUT/timeline_$c"
  done
  step paired 200 python3 bench/paired_split.py --engine engines/mini-h200 --prompts-file "$P" \
    --modes copy copy+drafter --per-category 4 --max-tokens 192 --warm-runs 1 --rounds 4 \
    --out "$OUT"
}

pack() {  # pack NAME: every file under $OUT into $OUT/NAME_results.tar.gz (the device machine
  # returns a limited number of files per call)
  tar -C "$OUT" -czf "/tmp/$1_results.tar.gz" . && rm -rf "${OUT:?}"/* && \
    mv "/tmp/$1_results.tar.gz" "$OUT/"
}

unpack() {  # unpack engines/NAME.tar.xz into engines/ when it was carried (bench/carry_engine.py:
  # tensors left out at packing come back from the tracked checkpoint)
  [ -f "engines/$1.tar.xz" ] || return 0
  python3 bench/carry_engine.py unpack "engines/$1.tar.xz" engines && echo "unpacked engines/$1.tar.xz"
}

allchecks() {  # gpu_check of every kernel, gpu_runtime and gpu_drafter graphs on the trained
  # default (engine carry-b); then PDL off for the kernel timings that follow
  unpack carry-b
  step check 240 python3 bench/gpu_check.py \
    --only fold,int4,fp8attn,nvfp4,nvfp4wg,fp8gemv,fp8wg,fp8fused,moe,norm,normfused,qknorm,gumbel,ringattn,ropering,vocabargmax,chainindex
  minichecks 300 60 graphs   # 230 s cut the last settings (h200-2026-12-02b/pb, pc)
  export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
}

wholesteps() {  # whole decode + verify steps under the default PDL (4), then PDL off for the
  # kernel timings that follow (kernels timed alone, as in plugins/NOTES.md)
  unset KOLIBRI_PDL
  step fullsize 200 python3 bench/fullsize.py --out "$OUT/fs" --parts decode,verify --budget 140
  export KOLIBRI_PDL=0
}

abtime() {  # abtime TAG CHECKS SECTIONS --set M.N=V...: gpu_check --only CHECKS under the
  # settings, then bench/plugins.py --only SECTIONS (PDL off) and whole decode + verify steps
  # (default PDL) without and with them, in one call
  local tag=$1 checks=$2 sections=$3
  shift 3
  step check 150 python3 bench/gpu_check.py --only "$checks" "$@"
  export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
  step "${tag}_off" 45 python3 bench/plugins.py --only "$sections" --quick
  step "${tag}_on" 45 python3 bench/plugins.py --only "$sections" --quick "$@"
  unset KOLIBRI_PDL
  # the call's first fullsize run pays the Triton compiles (~40 s; it reached only verify 16 x
  # (1+1) in 90 s, h200-2026-12-02d/kh/fs_one): 40 s more budget than the second
  local fs="python3 bench/fullsize.py --parts decode,verify --no-eager"
  step fs_off 150 $fs --budget 130 --out "$OUT/fs_off"
  step fs_on 110 $fs --budget 90 --out "$OUT/fs_on" "$@"
}

ncuprof() {  # ncuprof TARGET KERNEL_REGEX COUNT: Nsight Compute's full set on COUNT launches of
  # bench/ncu_targets.py TARGET (after 2 skipped), written as text: details and per-SASS counters
  step "ncu_$1" 150 ncu --clock-control none -k "regex:$2" --launch-skip 2 -c "$3" --set full \
    --import-source yes -f -o "$OUT/$1" python3 bench/ncu_targets.py "$1"
  ncu -i "$OUT/$1.ncu-rep" --page details > "$OUT/$1_details.txt" 2>&1
  ncu -i "$OUT/$1.ncu-rep" --page source --print-source sass --csv > "$OUT/$1_sass.csv" 2>&1
  ncu -i "$OUT/$1.ncu-rep" --page raw --csv > "$OUT/$1_raw.csv" 2>&1
  python3 bench/ncu_summary.py "$OUT/$1"   # stall summaries; drops the CSVs and the report
}

case "${PART:-}" in
  gw)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step gluon_gemv 420 python3 bench/gluon_gemv_probe.py --out "$OUT/gw"
    pack gw
    ;;
  pf)
    step check 80 python3 bench/gpu_check.py --only moepf   # moe itself: PART=fc
    step prefetch 90 python3 bench/moe_chunks.py --out "$OUT/pf" --variants prefetch
    local_fs="python3 bench/fullsize.py --parts decode --no-eager"
    step fs_off 85 $local_fs --budget 55 --out "$OUT/fs_off"   # the first run compiles (~48 s)
    step fs_pf2_1 60 $local_fs --budget 38 --out "$OUT/fs_pf2_1" \
      --set moe_route.PREFETCH_TOKENS=1
    step fs_pf3_2 60 $local_fs --budget 38 --out "$OUT/fs_pf3_2" \
      --set moe_route.PREFETCH_TOKENS=2 --set moe_route.PREFETCH=3
    step fs_next_1 60 $local_fs --budget 38 --out "$OUT/fs_next_1" \
      --set moe.PREFETCH_NEXT_TOKENS=1
    step fs_both_1 60 $local_fs --budget 38 --out "$OUT/fs_both_1" \
      --set moe_route.PREFETCH_TOKENS=1 --set moe.PREFETCH_NEXT_TOKENS=1
    step fs_off2 60 $local_fs --budget 38 --out "$OUT/fs_off2"
    pack pf
    ;;
  hx)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step attn_blocks 150 python3 bench/plugins.py --only attn --attn-blocks 16,64
    unset KOLIBRI_PDL
    step fullsize 200 python3 bench/fullsize.py --out "$OUT/fs" --parts decode --no-eager \
      --budget 170
    pack hx
    ;;
  fc)
    unpack carry-b
    step check 240 python3 bench/gpu_check.py --only fold,int4,fp8attn,nvfp4,nvfp4wg,fp8gemv,fp8wg,fp8fused,moe,moepf,norm,normfused,qknorm,gumbel,ringattn,ropering,vocabargmax,chainindex,splitk
    step runtime 300 python3 bench/gpu_runtime.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file engines/prompts/spec_bench_question.jsonl
    pack fc
    ;;
  gn)
    export KOLIBRI_PDL=0
    step gluon_nvfp4 420 python3 bench/gluon_nvfp4_probe.py --out "$OUT/gn"
    pack gn
    ;;
  ob)
    allchecks
    wholesteps
    pack ob
    ;;
  nr)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    ncuprof moe_m1 _moe_expert_kernel 2
    ncuprof moe_m256 _moe_expert_kernel 2
    ncuprof nvfp4_m1 _nvfp4_gemv_kernel 1
    ncuprof qkv_m1 _fp8_gemv_kernel 1
    ncuprof qkv_m64 _fp8_gemv_kernel 1
    pack nr
    ;;
  a)
    unpack carry-a
    step kernels 150 python3 bench/gpu_check.py --only norm,qknorm,fp8gemv,moe,splitk
    step runtime 230 python3 bench/gpu_runtime.py --engines engines/gpu-small --out "$OUT" \
      --prompts-file engines/gpu-small/spec_bench_question.jsonl
    step drafter 120 python3 bench/gpu_drafter.py --engines engines/gpu-small --out "$OUT" \
      --prompts-file engines/gpu-small/spec_bench_question.jsonl --only parity graphs round
    ;;
  sd)
    unpack carry-sd
    mkdir -p runs/gen
    step gen 230 python3 tools/gen_self_distill.py --engine engines/mini-h200 --device cuda \
      --corpus corpus/sub/train.jsonl.xz --out runs/gen/train.npy --samples 16384 \
      --max-tokens 384 --time-budget-s 170 --seed "${GEN_SEED:-0}"
    cp runs/gen/train.json "$OUT/gen_meta.json" 2>/dev/null
    step drafter_ft 330 python3 tools/train_drafter.py --corpus corpus/sub \
      --target checkpoints/kolibri-mini/target --run-dir runs/drafter --out runs/drafter/export \
      --init-from checkpoints/kolibri-mini/drafter --generated runs/gen/train.npy \
      --generated-fraction 0.75 --copy-miss-weight "${MISS_WEIGHT:-1}" --lr 3e-4 --steps 2500 --warmup 50 \
      --eval-every 500 --time-budget-s 290 --export-every-call --compile
    tar -C runs -cf "$OUT/drafter_sd.tar" drafter/export drafter/log.jsonl
    xz -T8 -3 -c runs/gen/train.npy > "$OUT/gen_train.npy.xz"
    ;;
  se)
    unpack carry-se
    P=engines/prompts/spec_bench_question.jsonl
    for m in copy copy+drafter; do
      step "split_${m//+/_}" 80 python3 bench/profile_generate.py --engine engines/mini-h200-sd \
        --prompts-file "$P" --modes "$m" --per-category 4 --max-tokens 192 --warm-runs 1 \
        --profiler off --out "$OUT/split_${m//+/_}"
    done
    ENGINE=engines/mini-h200-sd evalmini inproc 200 --categories mt_bench translation \
      --per-category 8 --humaneval 0 --max-tokens 192 --repeats 3 --temperatures 0 \
      --json "$OUT/eval_inproc.json"
    pack se
    ;;
  hp)
    unpack carry-se
    for m in copy copy+drafter; do
      for c in translation mt_bench; do
        step "hp_${m//+/_}_$c" 90 python3 bench/host_profile.py --engine engines/mini-h200-sd \
          --prompts-file engines/prompts/spec_bench_question.jsonl --mode "$m" \
          --categories "$c" --out "$OUT/$c"
      done
    done
    pack hp
    ;;
  fe)
    unpack carry-b
    E=(--categories mt_bench translation --humaneval 0 --max-tokens 192)
    evalmini greedy 150 "${E[@]}" --per-category 8 --repeats 3 --temperatures 0 \
      --json "$OUT/eval_greedy.json"
    evalmini sampled 120 "${E[@]}" --per-category 4 --repeats 2 --temperatures 0.8 \
      --json "$OUT/eval_sampled.json"
    evalmini acceptance 280 --per-category 4 --humaneval 4 --max-tokens 192 --repeats 3 \
      --json "$OUT/eval_h200.json"
    evalmini isolated 200 "${E[@]}" --per-category 4 --repeats 1 --temperatures 0 \
      --isolated 4 --json "$OUT/eval_isolated.json"
    pack fe
    ;;
  sp)
    unpack carry-b
    for m in copy copy+drafter; do
      step "split_${m//+/_}" 80 python3 bench/profile_generate.py --engine engines/mini-h200 \
        --prompts-file engines/prompts/spec_bench_question.jsonl --modes "$m" \
        --per-category 4 --max-tokens 192 --warm-runs 1 --profiler off \
        --out "$OUT/split_${m//+/_}"
    done
    pack sp
    ;;
  ga)
    unpack carry-b
    for g in always adaptive; do
      evalmini "gate_$g" 150 --categories mt_bench translation --per-category 8 --humaneval 0 \
        --max-tokens 192 --repeats 2 --drafter-gate "$g" --json "$OUT/gate_$g.json"
    done
    pack ga
    ;;
  tl)
    unpack carry-b
    timeline 120
    pack tl
    ;;
  tc)
    unpack carry-b
    step check 120 python3 bench/gpu_check.py --only chainindex,ringattn,ropering,vocabargmax
    timeline 100
    E=(--categories mt_bench translation --humaneval 0 --max-tokens 192)
    evalmini greedy 150 "${E[@]}" --per-category 8 --repeats 3 --temperatures 0 \
      --json "$OUT/eval_greedy.json"
    evalmini sampled 100 "${E[@]}" --per-category 4 --repeats 2 --temperatures 0.8 \
      --json "$OUT/eval_sampled.json"
    pack tc
    ;;
  ps)
    unpack carry-b
    step paired 200 python3 bench/paired_split.py --engine engines/mini-h200 \
      --prompts-file engines/prompts/spec_bench_question.jsonl --modes copy copy+drafter \
      --per-category 4 --max-tokens 192 --warm-runs 1 --rounds 4 --out "$OUT"
    pack ps
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

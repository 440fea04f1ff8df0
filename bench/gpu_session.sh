#!/usr/bin/env bash
# One H200 device call per part: check and time what changed in the kernel path since the last
# H200 run (bench/results/h200-2026-11-30/). Each step runs under its own timeout and writes its
# log and JSON under $OUT, so a failing step does not cost the others. Run from the repository
# root on the GPU machine. The parts of earlier sessions (c-v, w, y, z, za-zv) were removed once
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
#   PART=gk bash bench/gpu_session.sh   kernel by kernel inside each graph a decode step
#       replays (bench/graph_kernels.py, German and chat), then the timeline on 8 German
#       prompts with the copy+drafter engine built first (~3 min). carry: engines/carry-b.tar.xz
#   PART=gb bash bench/gpu_session.sh   the timeline and paired split (PART tl), then the
#       in-process chat + German eval (8 prompts, greedy and T = 0.8, medians of 2) with
#       --drafter-gate always, then adaptive (~8 min).           carry: engines/carry-b.tar.xz
#   PART=st bash bench/gpu_session.sh   the in-process chat + German eval with the prompts
#       served 4, then 8 at a time (--streams; 8 prompts each, greedy and T = 0.8, medians of
#       3) (~4 min).                                             carry: engines/carry-b.tar.xz
#   PART=cc bash bench/gpu_session.sh   chained rounds after copy-drafted steps too (the new
#       default) against after drafter steps only: the timeline (8 German prompts) and the
#       paired split (chat + German, 4 rounds) with copy, copy+drafter/chain-misses and
#       copy+drafter/chain-copy in one process; the in-process chat + German eval (8 prompts,
#       greedy and T = 0.8, medians of 2) (~6 min).             carry: engines/carry-b.tar.xz
#   PART=fz bash bench/gpu_session.sh   the final figures of this code: PART zu's README table,
#       then the in-process chat + German eval (8 prompts, greedy, medians of 3) (~5 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=tr bash bench/gpu_session.sh   the drafter's taps read by its GEMV's row index (no
#       gathers): gpu_drafter parity + graphs, graph_kernels (German), the in-process chat +
#       German eval (8 prompts, greedy and T = 0.8, medians of 2) (~4 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=zu bash bench/gpu_session.sh   the README's acceptance table (every category, 4
#       prompts + 4 HumanEval, greedy and T = 0.8, medians of 3) (~4 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=kt bash bench/gpu_session.sh   kernel tuning (~9 min, no engine): gpu_check nvfp4 + moe
#       (the NVFP4 GEMV's scale rows now load as 16-byte cp.async copies), bench/gemv_tune.py
#       (heads x M x launch settings, bits against the defaults), bench/moe_pipeline.py
#       --breakdown (MoE launch settings per M, then its kernels under the profiler).
#   PART=kd bash bench/gpu_session.sh   the weight decodes by bit placement (DECODE 2 in
#       fp8_gemv, moe_experts; ~10 min, no engine): gpu_check of those kernels on the
#       new defaults, bench/decode_ab.py (DECODE 1 / 2 / 1, bits compared), then
#       bench/plugins.py --only gemv,moe (the table on the new defaults).
#   PART=kf bash bench/gpu_session.sh   after PART kd (~10 min, no engine): gpu_check moe +
#       fp8gemv (a one-token MoE chunk skips its id scans), bench/gemv_tune.py --kernels fp8
#       (N tile x row tiles per program at 16-64 rows), bench/moe_pipeline.py --defaults-only
#       --breakdown, then bench/fullsize.py --parts decode (whole 50-layer steps).
#   PART=kg bash bench/gpu_session.sh   after PART kf (~9 min, no engine): gpu_check moe, fp8gemv,
#       fp8fused, splitk (MoE: later row tiles count before they scan, the shared expert's
#       programs first; fp8_gemv one row tile per program), moe_pipeline --defaults-only
#       --breakdown, bench/plugins.py --only attn,gemv,moe (the table), fullsize decode.
#   PART=kh bash bench/gpu_session.sh   bench/gemv_tune.py --kernels fp8,router (bytes in flight:
#       BLOCK_K x stages), then the in-process chat + German eval on the trained default with
#       this session's kernels (8 prompts, greedy, medians of 2) (~7 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=ki bash bench/gpu_session.sh   bench/gemv_tune.py --kernels nvfp4 (row tiles per program x
#       grid order, M_FIRST: the programs of one weight tile start together), gpu_check nvfp4
#       (~4 min, no engine).
#   PART=kj bash bench/gpu_session.sh   the trained default on this session's kernels: gpu_runtime
#       (graph = eager = unpadded bits, every speculative mode = off) and gpu_drafter --only
#       graphs (~6 min).                                         carry: engines/carry-b.tar.xz
#   PART=kk bash bench/gpu_session.sh   bench/sliding_tune.py: the FP8 sliding-window attention's
#       PART x BLOCK_N x warps x stages at B = 1 and 64, then gpu_check's FP8 attention checks
#       under the best (~3 min, no engine).
#   PART=ko bash bench/gpu_session.sh   bench/opcode_rates.py: results per clock per SM of LOP3,
#       PRMT, SHF, IMAD, HMUL2.BF16, F2F, F2FP, FFMA (does PRMT issue at the conversion rate?);
#       the router's H split (gemv_tune --kernels router); the MoE's settings again now that a
#       one-token chunk skips its scans (moe_pipeline: narrower N tiles, stages) (~5 min).
#   PART=la bash bench/gpu_session.sh   the router's H split on (SPLIT_H 5) and the FP8 sliding
#       window's 64-position splits: gpu_check moe + fp8attn, fullsize decode, then the trained
#       default: gpu_runtime, gpu_drafter --only graphs, the in-process chat + German eval (8
#       prompts, greedy, medians of 2) (~8 min).                carry: engines/carry-b.tar.xz
#   PART=lb bash bench/gpu_session.sh   coupled drafts (a sampled stream's drafter picks with the
#       target sampler's noise, EngineArgs.draft_sampling): gpu_check vocabargmax + gumbel, the
#       trained default's gpu_runtime and gpu_drafter --only graphs, then the in-process chat
#       + German eval (8 prompts, T = 0.8, medians of 2) coupled, then greedy drafts, then
#       greedy decoding (medians of 2) (~7 min).               carry: engines/carry-b.tar.xz
#   PART=lc bash bench/gpu_session.sh   held-out prompts (each category's first 8 left out: the
#       earlier runs chose settings on them), coupled drafts: chat + German, 16 prompts each,
#       greedy and T = 0.8, medians of 3; then the README's table (every category, 4 prompts
#       + 4 HumanEval, greedy and T = 0.8, medians of 3) (~6 min). carry: engines/carry-b.tar.xz
#   PART=ld bash bench/gpu_session.sh   bench/pdl_probe.py: a chain of small GEMVs in one CUDA
#       graph, plain launches against programmatic dependent launch (PDL), with and without
#       the weight tile loaded before the wait (~1 min, no engine).
#   PART=le bash bench/gpu_session.sh   programmatic dependent launch in every plugin kernel
#       (plugins/_common.py PDL; on in this part, KOLIBRI_PDL=1): gpu_check of the kernels
#       (graphs replayed twice, batch invariance), the trained default's gpu_runtime and
#       gpu_drafter --only graphs, fullsize decode, then the chat + German eval (8 prompts,
#       greedy, medians of 2) with PDL and with KOLIBRI_PDL=0 (~8 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=na bash bench/gpu_session.sh   (~5 min, no engine) gpu_check fold + its timing (query
#       heads split over programs), then Nsight Compute's full set on one launch of each
#       bench/ncu_targets.py target (INT4/FP8 attention, MoE, NVFP4 head, fold) as text
#   PART=nv bash bench/gpu_session.sh   (~3 min, no engine) the top-k kernel at one warp
#       (moe_route.TOPK_WARPS 1): gpu_check moe, whole decode steps
#   PART=nu bash bench/gpu_session.sh   (~9 min, engine carry-b) the router's top-k in the logits
#       kernel (moe_route.FUSED_TOPK: the last program of a token tile runs it) and
#       qk_norm_rope_kv_write (QK-norm + RoPE + FP8 cache write, one kernel): gpu_check
#       moe,qknorm,norm, the trained default's gpu_runtime and gpu_drafter graphs, whole steps,
#       bench/gemv_tune.py --kernels router (fused against the top-k kernel), the MoE and fold
#       rows of the kernel table (each fusion against the kernels it replaces)
#   PART=nt bash bench/gpu_session.sh   (~7 min, engine carry-b) the MoE's combine fused into the
#       next norm (moe_forward_parts + moe_combine_norm) and the swap at every MoE chunk
#       (SWAP_TOKENS 64): gpu_check moe,norm, the trained default's gpu_runtime and gpu_drafter
#       graphs, whole steps, the kernel table's MoE rows (fused against unfused)
#   PART=nw bash bench/gpu_session.sh   (~8 min, no engine) bench/moe_pipeline.py: the swapped MoE
#       experts under register caps (maxnreg 128 / 168: 4 programs per SM at 64 tokens instead
#       of 2), the row tiles as a runtime loop (TILE_LOOP), narrower N tiles, other stages and
#       BLOCK_K, M = 1, 4, 16, 64, bits checked; bench/int4_attn_ab.py (32-row verification
#       programs: ROWS_MAX 32)
#   PART=oa bash bench/gpu_session.sh   (~3 min, no engine) PDL mode 4 with the MoE's early launch
#       up to 16 tokens, the default now: gpu_check moe, whole decode steps (no eager)
#   PART=nz bash bench/gpu_session.sh   (~8 min, engine carry-b) PDL mode 4 (as 2, the MoE's
#       kernels as 3) and the MoE's stages 5 past 32 tokens (TUNE_SWAP_MOST): gpu_check moe
#       under modes 2 and 4, whole decode steps (no eager) under modes 2, 4, 2, then the trained
#       default's gpu_runtime and gpu_drafter graphs under mode 4
#   PART=ny bash bench/gpu_session.sh   (~7 min, no engine) PDL modes 3 (each kernel lets the
#       next launch once it has waited) and 4 (3, and the GEMV/MoE kernels prefetch their
#       weight tiles into L2 before the wait): gpu_check of those kernels under mode 4, then
#       whole decode steps under modes 2, 3, 4, 2 (the order guards against drift)
#   PART=nx bash bench/gpu_session.sh   (~8 min, engine carry-b) the MoE's row tiles as a runtime
#       loop by default (TILE_LOOP): gpu_check moe, the trained default's gpu_runtime and
#       gpu_drafter graphs, whole steps, bench/moe_pipeline.py (stages 5/6 and register caps
#       with the loop)
#   PART=nr bash bench/gpu_session.sh   (~6 min, no engine) Nsight Compute on the swapped kernels
#       (MoE at one token, NVFP4 LM head at one row, fp8_gemv QKV at 1 row) and fp8_gemv at 64
#       rows (WIDE_TILES); bench/gemv_tune.py --kernels fp8tiles,router (fp8_gemv's tiles at
#       16 and 64 rows incl. block scales; the router's splits and top-k warps)
#   PART=nq bash bench/gpu_session.sh   (~10 min, engine carry-b) fp8_gemv's WIDE_TILES: gpu_check of
#       the FP8 GEMVs and the MoE (and the MoE with the swap at every chunk size), the trained
#       default's gpu_runtime and gpu_drafter graphs, whole steps, bench/swap_ab.py --only
#       moe_wide (the swap at 16-64 tokens)
#   PART=np bash bench/gpu_session.sh   (~2 min, no engine) bench/gemv_tune.py --kernels fp8tiles:
#       fp8_gemv's N tile, row tiles, warps and split-K at 16 and 64 rows
#   PART=no bash bench/gpu_session.sh   (~7 min, engine carry-b) final checks: gpu_check of every
#       kernel, the trained default's gpu_runtime and gpu_drafter graphs, whole steps, the
#       kernel table's GEMV rows
#   PART=nn bash bench/gpu_session.sh   (~7 min, no engine) nvfp4_gemv's e2m1 decode 3 and its swap:
#       gpu_check nvfp4, moe (then nvfp4 with SWAP_ROWS 8), bench/decode_ab.py --only nvfp4,
#       bench/swap_ab.py --only nvfp4, the kernel table's GEMV and MoE rows
#   PART=nm bash bench/gpu_session.sh   (~9 min, engine carry-b) the swapped small-batch FP8 GEMMs
#       on by default: gpu_check of the FP8 GEMVs and the MoE, the trained default's gpu_runtime
#       and gpu_drafter graphs, whole steps (fullsize decode, verify), bench/swap_ab.py
#   PART=nl bash bench/gpu_session.sh   (~8 min, no engine) gpu_check of the FP8 GEMVs and the MoE
#       in the 16-row form (SWAP_TOKENS / SWAP_ROWS 0; at 4d1292d: the one-token swap off) and
#       with the defaults, then bench/swap_ab.py
#   PART=nk bash bench/gpu_session.sh   (~3 min, no engine) bench/decode_ab.py: the e4m3 decode 3
#       (prmt sign replication) against the conversion unit (at 6ea5bf4: against mode 2, since
#       removed) in fp8_gemv and the MoE, timings and bit equality
#   PART=nj bash bench/gpu_session.sh   (~7 min, no engine) the BLOCK 16 value path of 8cc5b7a:
#       gpu_check fold,int4,fp8attn, the attention table (its blk=16 rows), whole steps,
#       Nsight Compute on INT4 attention with 16-token pages at B=16, 32k
#   PART=ni bash bench/gpu_session.sh   (~5 min, engine carry-b) after a change to the INT4 cache:
#       gpu_check fold,int4,fp8attn, gpu_runtime and gpu_drafter graphs on the trained default,
#       bench/plugins.py --only study,attn,fold, bench/int4_attn_ab.py
#   PART=nf bash bench/gpu_session.sh   (~7 min, engine carry-b) final checks: gpu_check of every
#       kernel, the trained default's gpu_runtime and gpu_drafter graphs; with PDL off the kernel
#       table (bench/plugins.py --only attn,gemv,moe,fold) and bench/int4_attn_ab.py
#   PART=nb bash bench/gpu_session.sh   (~2 min, no engine) bench/int4_attn_ab.py: INT4 attention's
#       settings against DEFER_SUMS 0 (v5's bits) and FP8, gpu_check int4; then Nsight Compute
#       on it at B=16, 32k
#   PART=lf bash bench/gpu_session.sh   PDL mode 2 (each kernel lets the next launch after its
#       main loop): fullsize decode with KOLIBRI_PDL=0, 2, 0 (whole steps, the order guards
#       against drift), then gpu_check of the kernels and the trained default's gpu_runtime
#       under mode 2 (~8 min).                                  carry: engines/carry-b.tar.xz
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
  step check 175 python3 bench/gpu_check.py \
    --only fold,int4,fp8attn,nvfp4,fp8gemv,fp8fused,moe,norm,qknorm,gumbel,ringattn,ropering,vocabargmax,chainindex
  minichecks 180 35 graphs
  export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
}

wholesteps() {  # whole decode + verify steps under the default PDL (4), then PDL off for the
  # kernel timings that follow (kernels timed alone, as in plugins/NOTES.md)
  unset KOLIBRI_PDL
  step fullsize 200 python3 bench/fullsize.py --out "$OUT/fs" --parts decode,verify --budget 140
  export KOLIBRI_PDL=0
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
  oa)
    step check 100 python3 bench/gpu_check.py --only moe
    step fullsize 90 python3 bench/fullsize.py --out "$OUT/fs" --parts decode --budget 55 \
      --no-eager
    pack oa
    ;;
  nz)
    unpack carry-b
    step check 100 python3 bench/gpu_check.py --only moe
    KOLIBRI_PDL=4 step check_pdl4 100 python3 bench/gpu_check.py --only moe
    for run in 2 4 2b; do
      KOLIBRI_PDL=${run%b} step "fullsize_pdl$run" 90 python3 bench/fullsize.py \
        --out "$OUT/fs$run" --parts decode --budget 55 --no-eager
    done
    KOLIBRI_PDL=4 minichecks 220 35 graphs
    pack nz
    ;;
  ny)
    KOLIBRI_PDL=4 step check 200 python3 bench/gpu_check.py --only fp8gemv,fp8fused,splitk,moe,nvfp4
    for mode in 2 3 4; do
      KOLIBRI_PDL=$mode step "fullsize_pdl$mode" 100 python3 bench/fullsize.py \
        --out "$OUT/fs$mode" --parts decode --budget 60
    done
    KOLIBRI_PDL=2 step fullsize_pdl2b 100 python3 bench/fullsize.py --out "$OUT/fs2b" \
      --parts decode --budget 60
    pack ny
    ;;
  nx)
    unpack carry-b
    step check 120 python3 bench/gpu_check.py --only moe
    minichecks 240 35 graphs
    wholesteps
    step pipeline 110 python3 bench/moe_pipeline.py
    pack nx
    ;;
  nw)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step pipeline 300 python3 bench/moe_pipeline.py
    step int4ab 200 python3 bench/int4_attn_ab.py --budget 150
    pack nw
    ;;
  nv)
    step check 90 python3 bench/gpu_check.py --only moe
    step fullsize 120 python3 bench/fullsize.py --out "$OUT/fs" --parts decode --budget 70
    pack nv
    ;;
  nu)
    unpack carry-b
    step check 120 python3 bench/gpu_check.py --only moe,qknorm,norm
    minichecks 240 35 graphs
    wholesteps
    step tune 100 python3 bench/gemv_tune.py --kernels router
    step plugins 90 python3 bench/plugins.py --only moe,fold --csv "$OUT/plugins.csv"
    pack nu
    ;;
  nt)
    unpack carry-b
    step check 120 python3 bench/gpu_check.py --only moe,norm
    minichecks 210 35 graphs
    wholesteps
    step plugins 90 python3 bench/plugins.py --only moe --csv "$OUT/plugins.csv"
    pack nt
    ;;
  nr)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    ncuprof moe_m1 _moe_expert_kernel 2
    ncuprof nvfp4_m1 _nvfp4_gemv_kernel 1
    ncuprof qkv_m1 _fp8_gemv_kernel 1
    ncuprof qkv_m64 _fp8_gemv_kernel 1
    step tune 150 python3 bench/gemv_tune.py --kernels fp8tiles,router
    pack nr
    ;;
  nq)
    unpack carry-b
    step check 150 python3 bench/gpu_check.py --only fp8gemv,fp8fused,splitk,moe
    step check_wide 90 python3 bench/gpu_check.py --only moe --set moe_experts.SWAP_TOKENS=64
    minichecks 180 35 graphs
    step fullsize 200 python3 bench/fullsize.py --out "$OUT/fs" --parts decode,verify --budget 140
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step swap 150 python3 bench/swap_ab.py --only moe_wide
    pack nq
    ;;
  np)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step tiles 110 python3 bench/gemv_tune.py --kernels fp8tiles
    pack np
    ;;
  no)
    allchecks
    wholesteps
    step plugins 60 python3 bench/plugins.py --only gemv --csv "$OUT/plugins.csv"
    pack no
    ;;
  nn)
    step check 150 python3 bench/gpu_check.py --only nvfp4,moe
    step check_swap 90 python3 bench/gpu_check.py --only nvfp4 --set nvfp4_gemv.SWAP_ROWS=8
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step decode 120 python3 bench/decode_ab.py --only nvfp4 --nvfp4-modes 1,3  # 2,3 at 7cfa311
    step swap 150 python3 bench/swap_ab.py --only nvfp4
    step plugins 100 python3 bench/plugins.py --only gemv,moe --csv "$OUT/plugins.csv"
    pack nn
    ;;
  nm)
    unpack carry-b
    step check 150 python3 bench/gpu_check.py --only fp8gemv,fp8fused,moe,splitk
    minichecks 180 35 graphs
    step fullsize 200 python3 bench/fullsize.py --out "$OUT/fs" --parts decode,verify --budget 140
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step swap 200 python3 bench/swap_ab.py
    pack nm
    ;;
  nl)
    step check 150 python3 bench/gpu_check.py --only fp8gemv,fp8fused,moe,splitk \
      --set moe_experts.SWAP_TOKENS=0 --set fp8_gemv.SWAP_ROWS=0
    step check_swap 150 python3 bench/gpu_check.py --only fp8gemv,fp8fused,moe,splitk
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step swap 280 python3 bench/swap_ab.py
    pack nl
    ;;
  nk)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step decode 240 python3 bench/decode_ab.py --only fp8_gemv,moe --modes 1,3  # 2,3 at 6ea5bf4
    pack nk
    ;;
  nj)
    step check 90 python3 bench/gpu_check.py --only fold,int4,fp8attn
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step plugins 100 python3 bench/plugins.py --only attn --csv "$OUT/plugins.csv"
    unset KOLIBRI_PDL     # the default PDL mode for whole steps
    step fullsize 240 python3 bench/fullsize.py --out "$OUT/fs" --parts decode,verify --budget 170
    export KOLIBRI_PDL=0
    ncuprof int4_b16_blk16 _int4_attn_kernel 1
    pack nj
    ;;
  ni)
    unpack carry-b
    step check 90 python3 bench/gpu_check.py --only fold,int4,fp8attn
    minichecks 180 35 graphs
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step plugins 100 python3 bench/plugins.py --only study,attn,fold --csv "$OUT/plugins.csv"
    step int4ab 90 python3 bench/int4_attn_ab.py --budget 45
    pack ni
    ;;
  nf)
    allchecks
    step plugins 100 python3 bench/plugins.py --only attn,gemv,moe,fold --csv "$OUT/plugins.csv"
    step int4ab 110 python3 bench/int4_attn_ab.py --budget 70
    pack nf
    ;;
  nb)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step int4ab 330 python3 bench/int4_attn_ab.py --budget 240
    [ -n "${NO_NCU:-}" ] || ncuprof int4_b16 _int4_attn_kernel 1
    pack nb
    ;;
  na)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step check 90 python3 bench/gpu_check.py --only fold
    step fold 60 python3 bench/plugins.py --only fold
    ncuprof fold_t1 _qk_fold_int4_kernel 1
    ncuprof int4_b16 _int4_attn_kernel 1
    ncuprof int4_b1 _int4_attn_kernel 1
    ncuprof int4_b16_q4 _int4_attn_kernel 1
    ncuprof fp8_b16 _fp8_attn_kernel 1
    ncuprof sliding_b1 _fp8_attn_kernel 1
    ncuprof moe_m1 _moe_expert_kernel 2
    ncuprof nvfp4_m1 _nvfp4_gemv_kernel 1
    pack na
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
  gk)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    for c in translation mt_bench; do
      step "kernels_$c" 120 python3 bench/graph_kernels.py --engine engines/mini-h200 \
        --prompts-file "$P" --category "$c" --out "$OUT/kernels_$c"
    done
    step timeline8 120 python3 bench/gpu_timeline.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy+drafter copy --categories translation \
      --per-category 8 --max-tokens 192 --warm-runs 1 --rounds 2 --out "$OUT/timeline8"
    pack gk
    ;;
  gb)
    unpack carry-b
    timeline 100
    for g in always adaptive; do
      evalmini "gate_$g" 170 --categories mt_bench translation --per-category 8 --humaneval 0 \
        --max-tokens 192 --repeats 2 --temperatures 0 0.8 --drafter-gate "$g" \
        --json "$OUT/gate_$g.json"
    done
    pack gb
    ;;
  st)
    unpack carry-b
    for n in 4 8; do
      evalmini "streams$n" 200 --categories mt_bench translation --per-category 8 \
        --humaneval 0 --max-tokens 192 --repeats 3 --temperatures 0 0.8 --streams "$n" \
        --json "$OUT/streams$n.json"
    done
    pack st
    ;;
  cc)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    M=(copy copy+drafter/chain-misses copy+drafter/chain-copy)
    step timeline8 150 python3 bench/gpu_timeline.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes "${M[@]}" --categories translation --per-category 8 \
      --max-tokens 192 --warm-runs 1 --rounds 2 --out "$OUT/timeline8"
    step paired 150 python3 bench/paired_split.py --engine engines/mini-h200 --prompts-file "$P" \
      --modes "${M[@]}" --per-category 4 --max-tokens 192 --warm-runs 1 --rounds 4 --out "$OUT"
    evalmini eval 170 --categories mt_bench translation --per-category 8 --humaneval 0 \
      --max-tokens 192 --repeats 2 --temperatures 0 0.8 --json "$OUT/eval.json"
    pack cc
    ;;
  fz)
    unpack carry-b
    evalmini acceptance 280 --per-category 4 --humaneval 4 --max-tokens 192 --repeats 3 \
      --json "$OUT/eval_h200.json"
    evalmini greedy 150 --categories mt_bench translation --humaneval 0 --max-tokens 192 \
      --per-category 8 --repeats 3 --temperatures 0 --json "$OUT/eval_greedy.json"
    pack fz
    ;;
  tr)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step drafter 90 python3 bench/gpu_drafter.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P" --only parity graphs
    step kernels 90 python3 bench/graph_kernels.py --engine engines/mini-h200 \
      --prompts-file "$P" --category translation --out "$OUT/kernels"
    evalmini eval 120 --categories mt_bench translation --per-category 8 --humaneval 0 \
      --max-tokens 192 --repeats 2 --temperatures 0 0.8 --json "$OUT/eval.json"
    pack tr
    ;;
  ko)
    step rates 120 python3 bench/opcode_rates.py --out "$OUT"
    step router 100 python3 bench/gemv_tune.py --kernels router --out "$OUT"
    step moe 150 python3 bench/moe_pipeline.py --out "$OUT"
    pack ko
    ;;
  mx)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step int4regs 200 python3 bench/int4_attn_t_tune.py --regs
    pack mx
    ;;
  mq)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step study 120 python3 bench/plugins.py --only study,fold
    pack mq
    ;;
  mz)
    step fullsize 240 python3 bench/fullsize.py --out "$OUT/fs" --parts decode,verify --budget 170
    pack mz
    ;;
  mu)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step int4t 240 python3 bench/int4_attn_t_tune.py --budget 150
    step nvfp4ab 90 python3 bench/decode_ab.py --only nvfp4 --out "$OUT"
    unset KOLIBRI_PDL     # the default PDL mode for whole steps
    step fullsize 200 python3 bench/fullsize.py --out "$OUT/fs" --parts decode --budget 150
    pack mu
    ;;
  mv)
    allchecks
    step plugins 90 python3 bench/plugins.py --only attn,gemv,moe --csv "$OUT/plugins.csv"
    step int4t 70 python3 bench/int4_attn_t_tune.py --budget 35
    pack mv
    ;;
  mt)
    export KOLIBRI_PDL=0  # kernels timed alone, as in plugins/NOTES.md
    step int4t 420 python3 bench/int4_attn_t_tune.py --budget 300
    pack mt
    ;;
  lf)
    unpack carry-b
    for m in 0 2; do
      KOLIBRI_PDL=$m step "fullsize_pdl$m" 60 python3 bench/fullsize.py --out "$OUT/pdl$m" \
        --parts decode --budget 45
    done
    KOLIBRI_PDL=0 step fullsize_pdl0b 60 python3 bench/fullsize.py --out "$OUT/pdl0b" \
      --parts decode --budget 45
    export KOLIBRI_PDL=2
    step check 170 python3 bench/gpu_check.py \
      --only fold,int4,fp8attn,nvfp4,fp8gemv,fp8fused,moe,norm,qknorm,gumbel,ringattn,ropering,vocabargmax,chainindex
    minichecks 190 40 graphs
    pack lf
    ;;
  le)
    unpack carry-b
    export KOLIBRI_PDL=1     # the default was on when this part ran (deceb5a)
    step check 170 python3 bench/gpu_check.py \
      --only fold,int4,fp8attn,nvfp4,fp8gemv,fp8fused,moe,norm,qknorm,gumbel,ringattn,ropering,vocabargmax,chainindex
    minichecks 190 40 graphs
    step fullsize 60 python3 bench/fullsize.py --out "$OUT" --parts decode --budget 45
    evalmini eval_pdl 60 --categories mt_bench translation --per-category 8 --humaneval 0 \
      --max-tokens 192 --repeats 2 --temperatures 0 --json "$OUT/eval_pdl.json"
    KOLIBRI_PDL=0 evalmini eval_nopdl 60 --categories mt_bench translation --per-category 8 \
      --humaneval 0 --max-tokens 192 --repeats 2 --temperatures 0 --json "$OUT/eval_nopdl.json"
    pack le
    ;;
  ld)
    step pdl 120 python3 bench/pdl_probe.py --out "$OUT"
    pack ld
    ;;
  lc)
    unpack carry-b
    evalmini heldout 230 --categories mt_bench translation --per-category 16 --skip 8 \
      --humaneval 0 --max-tokens 192 --repeats 3 --json "$OUT/heldout.json"
    evalmini table 280 --per-category 4 --skip 8 --humaneval 4 --max-tokens 192 --repeats 3 \
      --json "$OUT/table.json"
    pack lc
    ;;
  lb)
    unpack carry-b
    step check 60 python3 bench/gpu_check.py --only vocabargmax,gumbel
    minichecks 200 40 graphs
    for ds in coupled greedy; do
      evalmini "sampled_$ds" 110 --categories mt_bench translation --per-category 8 \
        --humaneval 0 --max-tokens 192 --repeats 2 --temperatures 0.8 --draft-sampling "$ds" \
        --json "$OUT/sampled_$ds.json"
    done
    evalmini greedy 80 --categories mt_bench translation --per-category 8 --humaneval 0 \
      --max-tokens 192 --repeats 2 --temperatures 0 --json "$OUT/greedy.json"
    pack lb
    ;;
  la)
    unpack carry-b
    step check 110 python3 bench/gpu_check.py --only moe,fp8attn
    step fullsize 80 python3 bench/fullsize.py --out "$OUT" --parts decode --budget 60
    minichecks 240 60 graphs
    evalmini eval 120 --categories mt_bench translation --per-category 8 --humaneval 0 \
      --max-tokens 192 --repeats 2 --temperatures 0 --json "$OUT/eval.json"
    pack la
    ;;
  kk)
    step sliding 220 python3 bench/sliding_tune.py --out "$OUT"
    pack kk
    ;;
  kj)
    unpack carry-b
    minichecks 260 120 graphs
    pack kj
    ;;
  ki)
    step gemv 200 python3 bench/gemv_tune.py --kernels nvfp4 --out "$OUT"
    step check 80 python3 bench/gpu_check.py --only nvfp4
    pack ki
    ;;
  kh)
    unpack carry-b
    step gemv 200 python3 bench/gemv_tune.py --kernels fp8,router --out "$OUT"
    evalmini eval 200 --categories mt_bench translation --per-category 8 --humaneval 0 \
      --max-tokens 192 --repeats 2 --temperatures 0 --json "$OUT/eval.json"
    pack kh
    ;;
  kg)
    step check 170 python3 bench/gpu_check.py --only moe,fp8gemv,fp8fused,splitk
    step moe 60 python3 bench/moe_pipeline.py --out "$OUT" --defaults-only --breakdown
    step plugins 200 python3 bench/plugins.py --only attn,gemv,moe --csv "$OUT/plugins.csv"
    step fullsize 120 python3 bench/fullsize.py --out "$OUT" --parts decode --budget 100
    pack kg
    ;;
  kf)
    step check 100 python3 bench/gpu_check.py --only moe,fp8gemv
    step gemv 150 python3 bench/gemv_tune.py --kernels fp8 --out "$OUT"
    step moe 90 python3 bench/moe_pipeline.py --out "$OUT" --defaults-only --breakdown
    step fullsize 220 python3 bench/fullsize.py --out "$OUT" --parts decode --budget 190
    pack kf
    ;;
  kd)
    step check 150 python3 bench/gpu_check.py --only nvfp4,fp8gemv,fp8fused,moe,splitk
    step ab 260 python3 bench/decode_ab.py --out "$OUT"
    step plugins 170 python3 bench/plugins.py --only gemv,moe --csv "$OUT/plugins.csv"
    pack kd
    ;;
  kt)
    step check 110 python3 bench/gpu_check.py --only nvfp4,moe
    step nvfp4 250 python3 bench/gemv_tune.py --kernels nvfp4 --out "$OUT"
    step moe 200 python3 bench/moe_pipeline.py --out "$OUT" --breakdown
    pack kt
    ;;
  ps)
    unpack carry-b
    step paired 200 python3 bench/paired_split.py --engine engines/mini-h200 \
      --prompts-file engines/prompts/spec_bench_question.jsonl --modes copy copy+drafter \
      --per-category 4 --max-tokens 192 --warm-runs 1 --rounds 4 --out "$OUT"
    pack ps
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

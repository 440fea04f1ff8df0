#!/usr/bin/env bash
# One H200 device call per part: check and time what changed in the kernel path since the last
# H200 run (bench/results/h200-2026-11-30/). Each step runs under its own timeout and writes its
# log and JSON under $OUT, so a failing step does not cost the others. Run from the repository
# root on the GPU machine:
#
#   PART=a bash bench/gpu_session.sh   correctness (~5 min): the fused norm/RoPE kernels and the
#       split-K option against their references (graphs replayed twice), the runtime's graph =
#       eager = unpadded bits and lossless modes with the pinned metadata upload, the drafter
#       round's parity, graphs and host/device split.          carry: engines/carry-a.tar.xz
#   PART=c bash bench/gpu_session.sh   the split-K sweeps of fp8_gemv and the MoE expert GEMM
#       (bench/plugins.py; picks SPLIT_K per layer shape; ~5-8 min, mostly compilation).
#                                                               carry: nothing
#   PART=d bash bench/gpu_session.sh   the fused Gumbel-max sampler and the drafter's
#       ring-attention / RoPE + ring-write kernels checked (graphs, batch invariance), then the
#       MoE expert tile widths sweep (~2 min).
#                                                               carry: nothing
#   PART=e bash bench/gpu_session.sh   the drafter's fused kernels (~9 min): fp8_gemv's fused
#       options and vocab_argmax against their references; the drafter round's graphs (replay
#       == eager bits) and host/device split on the trained default (its parity with the fp32
#       reference: gpu_drafter's parity step on PART a's engines, whose tolerance fits them);
#       its acceptance and tokens/s per speculative mode, default and with the ring-attention
#       kernel + fused sampler.
#                                                               carry: engines/carry-b.tar.xz
#   PART=f bash bench/gpu_session.sh   where a drafter round's time goes (~9 min): the MoE tile
#       widths by tokens (gpu_check moe: bits vs the reference, batch invariance across widths),
#       the drafter round's graphs and timing, profile_generate (unprofiled step / propose /
#       drafter split per pass) with the dense and the kernel ring attention, and the
#       acceptance eval with 3 prompts per category, 192 tokens, medians of 3 repeats.
#                                                               carry: engines/carry-b.tar.xz
#   PART=g bash bench/gpu_session.sh   overlapped drafter rounds (~8 min): the acceptance eval
#       (3 prompts per category, 192 tokens, medians of 3) with the new defaults (kernel ring
#       attention, rounds prefetched after each step), again with the adaptive drafter gate;
#       full-size decode steps and drafter pass (the MoE tiles by tokens, the fused drafter).
#                                                               carry: engines/carry-b.tar.xz
#   PART=h bash bench/gpu_session.sh   the acceptance eval (3 prompts per category, 192 tokens,
#       medians of 3) with rounds prefetched only for the streams whose copy lookup will miss
#       (~6 min, most of it compiling the kernels on first use).
#                                                               carry: engines/carry-b.tar.xz
#   PART=i bash bench/gpu_session.sh   the adaptive drafter gate, greedy only, 2 prompts per
#       category, 128 tokens, medians of 2 (~3 min, most of it compiling).
#                                                               carry: engines/carry-b.tar.xz
#   PART=j bash bench/gpu_session.sh   the kernels refactored into shared helpers since their
#       H200 checks (fp8_gemv's norm prologue, nvfp4's, the argmax walk of gumbel / vocab_argmax),
#       then profile_generate's per-decode-step split for copy against copy+drafter, then the
#       adaptive drafter gate (PART i's eval) (~8 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=k bash bench/gpu_session.sh   the drafter's drafts left on the device until
#       verification (drafts_on_device): the runtime's lossless modes at 1 and 8 streams on the
#       trained default (also with host drafts and eager), the acceptance eval with them on and
#       off (greedy, 2 prompts per category, 128 tokens, medians of 2), the mini round's host
#       parts and kernels, profile_generate's split (~9 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=l bash bench/gpu_session.sh   where a drafted step's time goes (profile_generate's
#       finer parts and forward time by step tokens, copy vs copy+drafter), then the acceptance
#       eval (greedy, 2 prompts per category, 128 tokens, medians of 2) of the shipped drafter
#       and of the one fine-tuned with the copy-miss weight (engines/mini-h200-ft), and the
#       latter with the adaptive gate (~6 min).
#                                                               carry: engines/carry-c.tar.xz
#       (python build.py --target h200 --force --model checkpoints/kolibri-mini/target
#        --drafter runs/finetune-miss2/drafter/export --out engines/mini-h200-ft;
#        tar -C engines -cf - mini-h200 mini-h200-ft prompts | xz -9 > engines/carry-c.tar.xz)
#   PART=m bash bench/gpu_session.sh   host costs of a decode step's calls (bench/launch_costs.py:
#       the target's and the drafter's graph replays alone, alternating, back to back, on the
#       drafter's own stream or the current one; the runner's _fill), then the acceptance eval
#       (greedy, 2 prompts per category, 128 tokens, medians of 2) with drafter rounds on their
#       own stream and on the current one (~4 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=n bash bench/gpu_session.sh   the session's defaults checked and measured (~10 min):
#       gpu_runtime's lossless modes at 1 and 8 streams on the trained default (drafter rounds
#       on the current stream, drafts on the device, numpy step fill), launch_costs, the final
#       acceptance eval (3 prompts per category + 3 HumanEval, 192 tokens, greedy and T = 0.8,
#       medians of 3 with the modes taking turns), the adaptive gate (greedy, short).
#                                                               carry: engines/carry-b.tar.xz
#   PART=o bash bench/gpu_session.sh   the adaptive drafter gate on the final eval's prompts (3
#       per category + 3 HumanEval, 192 tokens, greedy and T = 0.8, medians of 3, modes taking
#       turns), then profile_generate's split with this session's defaults (~5 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=p bash bench/gpu_session.sh   launch_costs again, with the round's index upload and
#       taps copy before its replays, as in the engine (~1 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=q bash bench/gpu_session.sh   are the engine's slow graph replays first launches?
#       profile_generate's split (d_replay: the drafter's replays apart) without and with
#       --replay-after-capture, then the acceptance eval (greedy, 2 prompts per category, 128
#       tokens, medians of 2) both ways (~5 min). The flag changed nothing and is gone since:
#       this part runs on code 60624a1 only.
#                                                               carry: engines/carry-b.tar.xz
#   PART=r bash bench/gpu_session.sh   the drafter's ring attention split over the ring rows
#       (gpu_check ringattn; the round's kernel table), the target's graphs putting the deferred
#       drafts in themselves (gpu_runtime's lossless modes), launch_costs with the GPU busy and
#       the host's caches cold, profile_generate after a warm run with the garbage collector as
#       is and frozen, the short acceptance eval (~7 min). Every file comes back in one archive
#       ($OUT/r_results.tar.gz).                                carry: engines/carry-b.tar.xz
#   PART=s bash bench/gpu_session.sh   a steady drafter round as one graph (commit + round
#       merged): the round's graphs (replay == eager bits) and kernels, gpu_runtime's lossless
#       modes (T = 0 and 0.8, 1 and 8 streams), the short acceptance eval with the drafts on
#       the device and read on the host, profile_generate's split (~8 min); one archive back
#       ($OUT/s_results.tar.gz).                                carry: engines/carry-b.tar.xz
#   PART=t bash bench/gpu_session.sh   the final acceptance eval of the session (4 prompts per
#       category + 4 HumanEval, 192 tokens, greedy and T = 0.8, medians of 3, the modes taking
#       turns prompt by prompt), then profile_generate's split (~7 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=u bash bench/gpu_session.sh   chat and German with more prompts (8 per category of
#       mt_bench and translation, 192 tokens, greedy and T = 0.8, medians of 3, modes taking
#       turns prompt by prompt), the "always" and the adaptive drafter gate (~7 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=v bash bench/gpu_session.sh   PART u's "always" eval with the drafter's drafts read on
#       the host before the target pass (--drafts-on-device off) (~4 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=b bash bench/gpu_session.sh   speed (~8 min): full-size decode / verify / profile, the
#   PART=w bash bench/gpu_session.sh   the taps history written by the target's passes
#       (DrafterRunner.history, PluginRunner.use_taps_sink): the drafter round's graphs
#       (replay == eager bits), gpu_runtime's lossless modes (T = 0 and 0.8, 1 and 8 streams),
#       profile_generate's split, the short acceptance eval (~9 min); one archive back
#       ($OUT/w_results.tar.gz).                                carry: engines/carry-b.tar.xz
#   PART=y bash bench/gpu_session.sh   why every step is slower with the drafter on:
#       profile_generate's split (copy vs copy+drafter) as is, pinned to one CPU and to two,
#       with the garbage collector off and with the drafts read on the host; the chat and
#       German eval (4 prompts each, greedy, 192 tokens, medians of 2) as is and pinned to one
#       CPU (~7 min); one archive back ($OUT/y_results.tar.gz).  carry: engines/carry-b.tar.xz
#       (The pinned runs failed: `timeout` cannot run the shell function `pin`.)
#   PART=z bash bench/gpu_session.sh   profile_generate twice: copy, copy+drafter and
#       copy+drafter with every round refused (the drafter mode's per-step machinery alone),
#       with the target's graph replays by step tokens (~3 min); one archive back.
#                                                               carry: engines/carry-b.tar.xz
#   PART=za bash bench/gpu_session.sh   which part of the drafter mode's target graphs makes
#       their replays slow: copy against copy+drafter with every round refused, and that with
#       the graphs captured without the taps sink, without taps, without the drafts' put
#       (profile_generate's diagnostic variants), twice in opposite orders (~4 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=zb bash bench/gpu_session.sh   the session's final eval: chat and German (4 prompts
#       each, 192 tokens, greedy and T = 0.8, medians of 3) in one process and again with one
#       engine per process (--isolated 3: copy and copy+drafter, 3 processes each); then every
#       category (3 prompts + 3 HumanEval, medians of 2) in one process (~9 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=zc bash bench/gpu_session.sh   profile_generate with copy+drafter built first, then
#       copy first, then copy+drafter alone in its process (~4 min); one archive back.
#                                                               carry: engines/carry-b.tar.xz
#   PART=zd bash bench/gpu_session.sh   profile_generate with one engine per process, copy and
#       copy+drafter taking turns, 3 processes each (~3 min); one archive back.
#                                                               carry: engines/carry-b.tar.xz
#   PART=ze bash bench/gpu_session.sh   PART zb's chat and German eval again, greedy only,
#       with 4 processes per mode (~5 min).                   carry: engines/carry-b.tar.xz
#   PART=zf bash bench/gpu_session.sh   the machine's CPU/GPU topology, then PART ze's eval
#       (one engine per process, 4 processes per mode) with the engine pinned to the CPUs next
#       to the GPU (--cpu-affinity gpu-local) and without (~9 min).
#                                                               carry: engines/carry-b.tar.xz
#   PART=zg bash bench/gpu_session.sh   bench/graph_order.py: the graph replays of three
#       engines built one after another, on the current stream, on a stream of their own, and
#       after the first engine is deleted (~2 min).          carry: engines/carry-b.tar.xz
#       trained default's acceptance and tokens/s per speculative mode (again with the opt-in
#       ring-attention kernel and fused sampler), a host/device profile.
#                                                               carry: engines/carry-b.tar.xz
#   PART=zh bash bench/gpu_session.sh   pipelined loads (~7 min): INT4 and FP8 paged attention
#       with num_stages 5 (two code buffers; 2-4 compile to one), PART and tile variants
#       (bench/int4_attn_tune.py, checks on the two best); the MoE expert GEMM with its row tiles
#       outside the K loop (bench/moe_pipeline.py, bits vs the old loop) and gpu_check moe.
#   PART=zi bash bench/gpu_session.sh   the new attention defaults and fewer warps (~9 min):
#       int4_attn_tune round 2 (1-2 warps; FP8 warps), gpu_check int4 + fp8attn on the file
#       defaults, bench/graph_order.py (PART zg), fullsize decode (the pipelined MoE in whole
#       steps).                                                  carry: engines/carry-b.tar.xz
#   PART=zj bash bench/gpu_session.sh   the one-warp attention defaults (~9 min): int4_attn_tune
#       round 3, gpu_check int4 + fp8attn on the file defaults (sliding layers keep theirs), then
#       the whole bench/plugins.py table (issue 6's figures).
#   PART=zk bash bench/gpu_session.sh   the INT4 kernel's mask-free tiles, biased value codes and
#       conditional rescaling (int4_attn_tune round 4, checks on the three best), then the
#       attention rows of bench/plugins.py on the file defaults (~5 min).
#   PART=zl bash bench/gpu_session.sh   the session's kernels in the engine (~6 min): gpu_check
#       int4 on the final INT4 kernel, gpu_runtime (every speculative mode == off) and
#       gpu_drafter on the trained default, the short eval.   carry: engines/carry-b.tar.xz
#   PART=zm bash bench/gpu_session.sh   does a copy+drafter engine slow the graph replays of
#       engines built after it? bench/graph_order.py with a copy+drafter engine first, then
#       second (~3 min).                                         carry: engines/carry-b.tar.xz
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
  c)
    step splitk_gemv 280 python3 bench/plugins.py --only splitk_gemv
    step splitk_moe 280 python3 bench/plugins.py --only splitk_moe
    ;;
  d)
    step gumbel_drafter 240 python3 bench/gpu_check.py --only gumbel,ringattn,ropering
    step moe_tiles 330 python3 bench/plugins.py --only moe_tiles
    ;;
  e)
    unpack carry-b
    step kernels 170 python3 bench/gpu_check.py --only fp8gemv,fp8fused,vocabargmax
    step drafter 90 python3 bench/gpu_drafter.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file engines/prompts/spec_bench_question.jsonl --only graphs round
    evalmini acceptance 150 --per-category 2 --humaneval 2 \
      --max-tokens 128 --json "$OUT/eval_h200.json"
    evalmini acceptance_opt 150 --per-category 2 --humaneval 2 \
      --max-tokens 128 --drafter-attention kernel --json "$OUT/eval_opt.json"
    ;;
  f)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step moe 110 python3 bench/gpu_check.py --only moe
    step drafter 60 python3 bench/gpu_drafter.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P" --only graphs round
    step profile_dense 90 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy drafter copy+drafter --max-tokens 128 \
      --drafter-attention dense --out "$OUT/dense"
    step profile_kernel 70 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes drafter copy+drafter --max-tokens 128 \
      --drafter-attention kernel --out "$OUT/kernel"
    evalmini acceptance 210 --per-category 3 --humaneval 3 \
      --max-tokens 192 --repeats 3 --drafter-attention kernel --json "$OUT/eval_h200.json"
    ;;
  g)
    unpack carry-b
    evalmini acceptance 140 --per-category 3 --humaneval 3 \
      --max-tokens 192 --repeats 3 --json "$OUT/eval_h200.json"
    evalmini acceptance_adaptive 140 --per-category 3 --humaneval 3 \
      --max-tokens 192 --repeats 3 --drafter-gate adaptive --json "$OUT/eval_adaptive.json"
    step fullsize 200 python3 bench/fullsize.py --out "$OUT" --parts decode,drafter --budget 160
    ;;
  h)
    unpack carry-b
    evalmini acceptance 320 --per-category 3 --humaneval 3 \
      --max-tokens 192 --repeats 3 --json "$OUT/eval_h200.json"
    ;;
  i)
    unpack carry-b
    evalmini acceptance_adaptive 170 --per-category 2 --humaneval 0 \
      --max-tokens 128 --repeats 2 --temperatures 0 --drafter-gate adaptive \
      --json "$OUT/eval_adaptive.json"
    ;;
  j)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step kernels 200 python3 bench/gpu_check.py \
      --only fp8gemv,fp8fused,vocabargmax,gumbel,nvfp4,norm
    step profile 150 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --out "$OUT/profile"
    evalmini acceptance_adaptive 170 --per-category 2 --humaneval 0 \
      --max-tokens 128 --repeats 2 --temperatures 0 --drafter-gate adaptive \
      --json "$OUT/eval_adaptive.json"
    ;;
  k)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step runtime 170 python3 bench/gpu_runtime.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P"
    shorteval acceptance 130 --json "$OUT/eval_h200.json"
    shorteval acceptance_host 100 --drafts-on-device off --json "$OUT/eval_host.json"
    step drafter 60 python3 bench/gpu_drafter.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P" --only round
    step profile 80 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --out "$OUT/profile"
    ;;
  l)
    unpack carry-c
    P=engines/prompts/spec_bench_question.jsonl
    step profile 100 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --out "$OUT"
    shorteval acceptance 130
    ENGINE=engines/mini-h200-ft evalmini acceptance_ft 80 --per-category 2 --humaneval 0 \
      --max-tokens 128 --repeats 2 --temperatures 0 --json "$OUT/eval_ft.json"
    ENGINE=engines/mini-h200-ft evalmini acceptance_ft_adaptive 80 --per-category 2 \
      --humaneval 0 --max-tokens 128 --repeats 2 --temperatures 0 --drafter-gate adaptive
    ;;
  m)
    unpack carry-b
    step launch_costs 150 python3 bench/launch_costs.py --engine engines/mini-h200 --out "$OUT"
    shorteval acceptance 120
    shorteval acceptance_current 80 --drafter-stream current
    ;;
  n)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step runtime 180 python3 bench/gpu_runtime.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P"
    step launch_costs 60 python3 bench/launch_costs.py --engine engines/mini-h200 --out "$OUT"
    evalmini acceptance 270 --per-category 3 --humaneval 3 --max-tokens 192 --repeats 3 \
      --json "$OUT/eval_h200.json"
    shorteval acceptance_adaptive 80 --drafter-gate adaptive
    ;;
  o)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    evalmini acceptance_adaptive 260 --per-category 3 --humaneval 3 --max-tokens 192 \
      --repeats 3 --drafter-gate adaptive --json "$OUT/eval_adaptive.json"
    step profile 100 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --out "$OUT"
    ;;
  p)
    unpack carry-b
    step launch_costs 120 python3 bench/launch_costs.py --engine engines/mini-h200 --out "$OUT"
    ;;
  q)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step profile 100 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --out "$OUT/plain"
    step profile_replayed 60 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --replay-after-capture \
      --out "$OUT/replayed"
    shorteval acceptance 120
    shorteval acceptance_replayed 80 --replay-after-capture
    ;;
  r)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step ringattn 150 python3 bench/gpu_check.py --only ringattn
    minichecks 180 60 round
    step launch_costs 90 python3 bench/launch_costs.py --engine engines/mini-h200 --out "$OUT"
    step profile 90 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --warm-runs 1 \
      --out "$OUT/profile"
    step profile_freeze 90 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --warm-runs 1 \
      --gc freeze --out "$OUT/profile_freeze"
    shorteval acceptance 120 --json "$OUT/eval_h200.json"
    pack r
    ;;
  s)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step drafter 90 python3 bench/gpu_drafter.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P" --only graphs round
    step runtime 260 python3 bench/gpu_runtime.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P"
    shorteval acceptance 100 --json "$OUT/eval_h200.json"
    shorteval acceptance_host 80 --drafts-on-device off --json "$OUT/eval_host.json"
    step profile 60 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --warm-runs 1 \
      --out "$OUT/profile"
    pack s
    ;;
  t)
    unpack carry-b
    evalmini acceptance 420 --per-category 4 --humaneval 4 --max-tokens 192 --repeats 3 \
      --json "$OUT/eval_h200.json"
    step profile 60 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file engines/prompts/spec_bench_question.jsonl --modes copy copy+drafter \
      --max-tokens 128 --warm-runs 1 --out "$OUT"
    ;;
  u)
    unpack carry-b
    evalmini acceptance 240 --categories mt_bench translation --per-category 8 --humaneval 0 \
      --max-tokens 192 --repeats 3 --json "$OUT/eval_h200.json"
    evalmini acceptance_adaptive 200 --categories mt_bench translation --per-category 8 \
      --humaneval 0 --max-tokens 192 --repeats 3 --drafter-gate adaptive \
      --json "$OUT/eval_adaptive.json"
    ;;
  v)
    unpack carry-b
    evalmini acceptance_host 300 --categories mt_bench translation --per-category 8 \
      --humaneval 0 --max-tokens 192 --repeats 3 --drafts-on-device off \
      --json "$OUT/eval_host.json"
    ;;
  w)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step drafter 90 python3 bench/gpu_drafter.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P" --only graphs round
    step runtime 270 python3 bench/gpu_runtime.py --engine engines/mini-h200 --out "$OUT" \
      --prompts-file "$P"
    step profile 60 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --warm-runs 1 \
      --out "$OUT/profile"
    shorteval acceptance 100 --json "$OUT/eval_h200.json"
    pack w
    ;;
  y)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    PROF=(python3 bench/profile_generate.py --engine engines/mini-h200 --prompts-file "$P"
          --modes copy copy+drafter --max-tokens 128 --warm-runs 1)
    pin() {  # pin CPUS COMMAND...: run COMMAND on the CPUs CPUS (comma-separated) only
      python3 -c 'import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
os.execvp(sys.argv[2], sys.argv[2:])' "$@"
    }
    step profile 45 "${PROF[@]}" --out "$OUT/profile"
    step profile_pin1 45 pin 4 "${PROF[@]}" --out "$OUT/profile_pin1"
    step profile_pin2 45 pin 4,5 "${PROF[@]}" --out "$OUT/profile_pin2"
    step profile_gcoff 45 "${PROF[@]}" --gc off --out "$OUT/profile_gcoff"
    step profile_hostdrafts 45 "${PROF[@]}" --drafts-on-device off --out "$OUT/profile_host"
    E=(--engine engines/mini-h200 --prompts-dir engines/prompts --device cuda
       --categories mt_bench translation --per-category 4 --humaneval 0 --max-tokens 192
       --repeats 2 --temperatures 0)
    step acceptance 110 python3 tools/eval_acceptance.py "${E[@]}" --json "$OUT/eval.json"
    step acceptance_pin1 110 pin 4 python3 tools/eval_acceptance.py "${E[@]}" \
      --json "$OUT/eval_pin1.json"
    pack y
    ;;
  z)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    for i in 1 2; do
      step profile_$i 100 python3 bench/profile_generate.py --engine engines/mini-h200 \
        --prompts-file "$P" --modes copy copy+drafter copy+drafter/no-rounds --max-tokens 128 \
        --warm-runs 1 --out "$OUT/profile_$i"
    done
    pack z
    ;;
  za)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    M=(copy copy+drafter/no-rounds copy+drafter/no-rounds+no-sink copy+drafter/no-rounds+no-taps
       copy+drafter/no-rounds+no-draft-put)
    step profile_1 150 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes "${M[@]}" --max-tokens 128 --warm-runs 1 --out "$OUT/profile_1"
    R=(); for ((i=${#M[@]}-1; i>=0; i--)); do R+=("${M[i]}"); done
    step profile_2 150 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes "${R[@]}" --max-tokens 128 --warm-runs 1 --out "$OUT/profile_2"
    pack za
    ;;
  zb)
    unpack carry-b
    evalmini isolated 330 --categories mt_bench translation --per-category 4 --humaneval 0 \
      --max-tokens 192 --repeats 3 --isolated 3 --json "$OUT/eval_isolated.json"
    evalmini acceptance 240 --per-category 3 --humaneval 3 --max-tokens 192 --repeats 2 \
      --json "$OUT/eval_h200.json"
    ;;
  zc)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    step profile_cd_first 100 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy+drafter copy --max-tokens 128 --warm-runs 1 \
      --out "$OUT/profile_cd_first"
    step profile_copy_first 100 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy copy+drafter --max-tokens 128 --warm-runs 1 \
      --out "$OUT/profile_copy_first"
    step profile_cd_alone 80 python3 bench/profile_generate.py --engine engines/mini-h200 \
      --prompts-file "$P" --modes copy+drafter --max-tokens 128 --warm-runs 1 \
      --out "$OUT/profile_cd_alone"
    pack zc
    ;;
  zd)
    unpack carry-b
    P=engines/prompts/spec_bench_question.jsonl
    for i in 1 2 3; do
      for m in copy copy+drafter; do
        n=${m/+/_}_$i
        step "profile_$n" 60 python3 bench/profile_generate.py --engine engines/mini-h200 \
          --prompts-file "$P" --modes "$m" --max-tokens 128 --warm-runs 1 --out "$OUT/$n"
      done
    done
    pack zd
    ;;
  ze)
    unpack carry-b
    evalmini isolated 300 --categories mt_bench translation --per-category 4 --humaneval 0 \
      --max-tokens 192 --repeats 2 --temperatures 0 --isolated 4 \
      --json "$OUT/eval_isolated.json"
    ;;
  zf)
    unpack carry-b
    step topo 30 bash -c 'nvidia-smi topo -m; lscpu | head -30; nproc;
      python3 -c "import os; print(sorted(os.sched_getaffinity(0)))"'
    E=(--categories mt_bench translation --per-category 4 --humaneval 0 --max-tokens 192
       --repeats 2 --temperatures 0 --isolated 4)
    evalmini isolated_gpu_local 260 "${E[@]}" --cpu-affinity gpu-local \
      --json "$OUT/eval_isolated_gpu_local.json"
    evalmini isolated 260 "${E[@]}" --json "$OUT/eval_isolated.json"
    ;;
  zh)
    step attn_tune 330 python3 bench/int4_attn_tune.py --budget 220 --checks 2
    step moe_pipeline 150 python3 bench/moe_pipeline.py --out "$OUT"
    step moe_check 90 python3 bench/gpu_check.py --only moe
    ;;
  zi)
    unpack carry-b
    step attn_tune 170 python3 bench/int4_attn_tune.py --budget 110 --checks 2
    step attn_check 80 python3 bench/gpu_check.py --only int4,fp8attn
    step graph_order 120 python3 bench/graph_order.py --engine engines/mini-h200 --out "$OUT"
    step fullsize 200 python3 bench/fullsize.py --out "$OUT" --parts decode --budget 150
    ;;
  zj)
    step attn_tune 130 python3 bench/int4_attn_tune.py --budget 80 --checks 1
    step attn_check 80 python3 bench/gpu_check.py --only int4,fp8attn
    step plugins 330 python3 bench/plugins.py --csv "$OUT/plugins.csv"
    pack zj
    ;;
  zk)
    step attn_tune 200 python3 bench/int4_attn_tune.py --budget 120 --checks 3
    step plugins_attn 200 python3 bench/plugins.py --only attn --csv "$OUT/plugins_attn.csv"
    pack zk
    ;;
  zl)
    unpack carry-b
    step attn_check 60 python3 bench/gpu_check.py --only int4
    minichecks 270 90 graphs round
    shorteval acceptance 120 --json "$OUT/eval_h200.json"
    pack zl
    ;;
  zm)
    unpack carry-b
    step order_cd_first 55 python3 bench/graph_order.py --engine engines/mini-h200 \
      --modes copy+drafter copy copy --out "$OUT/cd_first"
    step order_cd_second 55 python3 bench/graph_order.py --engine engines/mini-h200 \
      --modes copy copy+drafter copy --out "$OUT/cd_second"
    ;;
  zg)
    unpack carry-b
    step graph_order 150 python3 bench/graph_order.py --engine engines/mini-h200 --out "$OUT"
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

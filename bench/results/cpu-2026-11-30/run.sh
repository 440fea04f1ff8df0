#!/bin/bash
# Issue 5 sweep on the trained default engine (engines/gb10 from checkpoints/kolibri-mini):
# every Spec-Bench category + 13 HumanEval prompts, greedy + 2 sampled seeds, 1 and 4 streams
cd /work/main
export OMP_NUM_THREADS=1
for spec in "0 0" "0.8 1" "0.8 2"; do
  set -- $spec
  .venv/bin/python bench/spec_decode.py --engine engines/gb10 --per-category 1 --streams 1 4 --max-tokens 48 --temperature $1 --seed $2 --json runs/sweep2/specbench_t$1_s$2.json > runs/sweep2/specbench_t$1_s$2.txt 2>&1
  .venv/bin/python bench/spec_decode.py --engine engines/gb10 --prompts-file ../shared/data/prompts/human_eval.jsonl.gz --per-category 13 --limit 13 --streams 1 4 --max-tokens 48 --temperature $1 --seed $2 --json runs/sweep2/humaneval_t$1_s$2.json > runs/sweep2/humaneval_t$1_s$2.txt 2>&1
done
echo done > runs/sweep2/DONE

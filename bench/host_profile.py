#!/usr/bin/env python3
"""Where a speculative mode's host time goes, function by function (cProfile).

    python3 bench/host_profile.py --engine engines/mini-h200 --mode copy+drafter \
        [--categories translation] [--per-category 4] [--max-tokens 192] [--out DIR]

One engine (`LLM`, one stream at a time), a short warm-up and one whole untimed generate of
the prompts, then one generate under `cProfile`. Prints, per target pass (the requests'
`num_steps` summed), the functions with the most own time (tottime) and, for the project's
functions (kolibri_trt, plugins), the most inclusive time (cumtime), in µs per pass; writes
DIR/host_profile_<mode>.prof (pstats) and .txt. cProfile slows Python calls (each call costs
about 0.1-0.3 µs more), so compare modes with one another, not with unprofiled timings
(`bench/profile_generate.py --profiler off` gives those).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "bench"))
import gpu_env  # noqa: E402,F401

from kolibri_trt import LLM, SamplingParams  # noqa: E402
from profile_generate import PROMPTS, bench_prompts  # noqa: E402

TOP = 45          # rows per table
PROJECT = ("kolibri_trt", "plugins", "kolibri_trt_plugins")


def table(stats: pstats.Stats, key: str, passes: int, project_only: bool) -> str:
    """Rows `µs/pass  calls/pass  function` sorted by `key` ("tottime" or "cumtime")."""
    idx = {"tottime": 2, "cumtime": 3}[key]
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in stats.stats.items():
        if project_only and not any(p in file for p in PROJECT):
            continue
        short = "/".join(Path(file).parts[-2:]) if file != "~" else ""
        rows.append(((cc, nc, tt, ct)[idx], nc, f"{short}:{line}({name})"))
    rows.sort(reverse=True)
    return "\n".join(f"{t * 1e6 / passes:9.2f} µs {n / passes:7.2f}x  {fn}"
                     for t, n, fn in rows[:TOP])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--mode", required=True, choices=["off", "copy", "drafter", "copy+drafter"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts-file", type=Path, default=PROMPTS)
    ap.add_argument("--categories", nargs="+", default=["translation"])
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    prompts = bench_prompts(args)
    llm = LLM(args.engine, speculative=args.mode, max_num_seqs=1, device=args.device)
    ids = [llm.tokenizer.encode(p.text, add_bos=True) for p in prompts]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(ids, SamplingParams(max_tokens=2))
    llm.generate(ids, params)
    prof = cProfile.Profile()
    prof.enable()
    res = llm.generate(ids, params)
    prof.disable()
    passes = sum(r.metrics.num_steps for r in res)
    stats = pstats.Stats(prof, stream=io.StringIO())
    total = sum(v[2] for v in stats.stats.values())
    text = (f"== {args.mode}: {len(res)} requests, {passes} target passes, profiled host "
            f"time {total * 1e6 / passes:.1f} µs per pass\n"
            f"-- own time (tottime) per pass\n{table(stats, 'tottime', passes, False)}\n"
            f"-- project functions, inclusive time (cumtime) per pass\n"
            f"{table(stats, 'cumtime', passes, True)}\n")
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.mode.replace("+", "_")
    stats.dump_stats(str(args.out / f"host_profile_{name}.prof"))
    (args.out / f"host_profile_{name}.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

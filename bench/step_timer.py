"""Wall-clock timers over an engine's decode steps (bench/profile_generate.py's unprofiled
split of a step into its parts): `PARTS` names the timed methods, `StepTimer` wraps them,
`timed_split` runs one generate under it."""

from __future__ import annotations

import statistics
import sys
import time

import torch


PARTS = (("propose", "engine", "_propose"), ("forward", "runner", "forward"),
         ("verify", "engine", "_verify_all"), ("observe", "speculator", "observe"),
         ("prefetch", "speculator", "prefetch"), ("drafter", "drafter", "propose_batch"),
         ("launch", "drafter", "launch"), ("collect", "drafter", "collect"),
         # finer: the step's schedule and metadata, the target runner's input fill (+ upload,
         # + the drafts' device copy), every CUDA graph replay call (target and drafter), the
         # deferred-drafts forward, the drafter launch's input gathering and runner step
         ("schedule", "scheduler", "schedule"), ("metadata", "engine_module", "build_metadata"),
         ("fill", "runner", "_fill"), ("fill_host", "runner", "_fill_host"),
         ("upload", "runner", "_upload"), ("replay", "graph", "replay"),
         ("forward_deferred", "engine", "_forward_deferred"),
         # the chained round's enqueueing while a step is verified (spec/drafter_chain.py)
         ("chain", "drafter", "chain"),
         ("d_inputs", "drafter", "_collect"), ("d_step", "drafter_runner", "step"),
         # the drafter's graph replays alone (replay counts the target's too)
         ("d_replay", "drafter_runner", "_replay"),
         # the rest of `LLMEngine.step`: its commit of the verified tokens (outputs, stop
         # checks, detokenization), the engine's observe (the proposers' bookkeeping), the
         # taps rows, the chained streams, the deferred drafts' hand-over, the gate's timing
         ("commit", "engine", "_commit"), ("record", "engine", "_record"),
         ("e_observe", "engine", "_observe"), ("taps_dst", "engine", "_taps_dst"),
         ("chain_items", "engine_module", "chain_items"),
         ("take_deferred", "speculator", "take_deferred"), ("time_step", "engine", "_time_step"))


class StepTimer:
    """Wall-clock timers on an engine's methods (PARTS), counted over decode steps only (every
    running stream past its prefill): `install` wraps them, `remove` restores them, `summary`
    turns the seconds into ms per decode step (see `timed_split`)."""

    def __init__(self, eng):
        drafter = eng.speculator.drafter
        self.eng = eng
        self.objs = {"engine": eng, "runner": eng.runner, "speculator": eng.speculator,
                     "drafter": drafter, "scheduler": eng.scheduler,
                     "graph": torch.cuda.CUDAGraph,
                     "engine_module": sys.modules[type(eng).__module__],
                     "drafter_runner": getattr(drafter, "runner", None)}
        self.acc = dict.fromkeys(["step", "decode_steps", "drafter_rounds"]
                                 + [k for k, _, _ in PARTS], 0.0)
        self.decode, self.tokens = False, 0
        self.samples: list[float] = []                  # each decode step's wall seconds
        self.step_by_tokens: dict[int, list[float]] = {}   # step seconds by its pass's tokens
        self.cur: dict[str, float] = {}                    # this step's part seconds
        self.parts_by_tokens: dict[int, dict[str, float]] = {}   # summed part seconds, the same
        self.by_tokens: dict[int, list[float]] = {}    # runner.forward seconds by step tokens
        self.replay_by_tokens: dict[int, list[float]] = {}   # its graph replays' seconds
        self.round_key = "launch" if hasattr(drafter, "launch") else "drafter"
        self.undo: list = []

    def _wrap(self, obj, name, key):
        orig = getattr(obj, name)

        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                if self.decode:
                    dt = time.perf_counter() - t0
                    self.acc[key] += dt
                    self.cur[key] = self.cur.get(key, 0.0) + dt
                    self.acc["drafter_rounds"] += key == self.round_key
        setattr(obj, name, run)
        self.undo.append(lambda: setattr(obj, name, orig))

    def _step(self, orig):
        def run():
            running = self.eng.scheduler.running
            self.decode = bool(running) and all(q.num_pending == 1 for q in running)
            self.acc["decode_steps"] += self.decode
            self.cur.clear()
            t0 = time.perf_counter()
            try:
                return orig()
            finally:
                if self.decode:
                    dt = time.perf_counter() - t0
                    self.acc["step"] += dt
                    self.samples.append(dt)
                    self.step_by_tokens.setdefault(self.tokens, []).append(dt)
                    into = self.parts_by_tokens.setdefault(self.tokens, {})
                    for k, v in self.cur.items():
                        into[k] = into.get(k, 0.0) + v
                self.decode = False
        return run

    def _forward(self, forward):
        def run(meta, *a, **kw):
            t0, r0 = time.perf_counter(), self.acc["replay"]
            try:
                return forward(meta, *a, **kw)
            finally:
                if self.decode:
                    t = self.tokens = int(meta.num_tokens)
                    self.by_tokens.setdefault(t, []).append(time.perf_counter() - t0)
                    self.replay_by_tokens.setdefault(t, []).append(self.acc["replay"] - r0)
        return run

    def install(self) -> None:
        for k, o, n in PARTS:
            if self.objs[o] is not None and hasattr(self.objs[o], n):
                self._wrap(self.objs[o], n, k)
        eng = self.eng
        forward, step = eng.runner.forward, eng.step
        eng.runner.forward = self._forward(forward)
        self.undo.append(lambda: setattr(eng.runner, "forward", forward))
        eng.step = self._step(step)
        self.undo.append(lambda: setattr(eng, "step", step))

    def remove(self) -> None:
        for u in reversed(self.undo):
            u()
        self.undo.clear()

    def summary(self, res) -> dict:
        """ms per decode step of the step and its parts, by step tokens, and the totals."""
        acc, n = self.acc, max(1, self.acc["decode_steps"])
        out = {f"{k}_ms": acc[k] * 1e3 / n for k in ["step"] + [k for k, _, _ in PARTS]}
        out["forward_by_tokens"] = {t: {"steps": len(v), "median_ms": statistics.median(v) * 1e3}
                                    for t, v in sorted(self.by_tokens.items())}
        out["step_by_tokens"] = _medians_means(self.step_by_tokens)
        out["parts_by_tokens"] = {    # mean ms per step of that kind (prefetch: the next step's)
            t: {k: v * 1e3 / len(self.step_by_tokens[t]) for k, v in parts.items()}
            for t, parts in sorted(self.parts_by_tokens.items())}
        out["replay_by_tokens"] = _medians_means(self.replay_by_tokens)
        # what tools/eval_acceptance.py times: first token to last, summed over the requests
        out["decode_wall_ms"] = sum(r.metrics.total_time_s - r.metrics.time_to_first_token_s
                                    for r in res) * 1e3
        out["decode_steps_ms"] = acc["step"] * 1e3
        out["decode_tokens"] = sum(r.metrics.num_generated_tokens - 1 for r in res)
        samples = self.samples
        out.update(decode_steps=int(acc["decode_steps"]),
                   step_median_ms=statistics.median(samples) * 1e3 if samples else 0.0,
                   step_max_ms=max(samples, default=0.0) * 1e3,
                   drafter_rounds_per_step=acc["drafter_rounds"] / n)
        return out


def _medians_means(by_tokens: dict[int, list[float]]) -> dict:
    """{tokens: steps, median_ms, mean_ms} of seconds lists keyed by a step's tokens."""
    return {t: {"steps": len(v), "median_ms": statistics.median(v) * 1e3,
                "mean_ms": statistics.fmean(v) * 1e3} for t, v in sorted(by_tokens.items())}


def timed_split(llm, ids, params) -> dict:
    """An unprofiled generate with wall-clock timers (`StepTimer`), counted over decode steps
    only (every running stream past its prefill): ms per decode step of the whole step and of
    its parts, the proposal (`LLMEngine._propose`: copy lookups + waiting for the drafter's
    drafts), the target pass's launch (`runner.forward`), verification (`_verify_all`, its
    host sync included), `Speculator.observe` and `prefetch`, the drafter's `propose_batch` (a
    round on demand, launch + collect), `launch` (staging, upload, replays) and `collect`
    (waiting for the drafts); drafter rounds per decode step."""
    timer = StepTimer(llm.engine)
    timer.install()
    try:
        res = llm.generate(ids, params)
    finally:
        timer.remove()
    return timer.summary(res)

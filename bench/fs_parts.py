"""bench/fullsize.py, part 3 of 5: the decode, verify and kv parts."""

from __future__ import annotations


import torch

import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from kolibri_trt.runtime.kv_cache import bytes_per_token  # noqa: E402
from kolibri_trt.runtime.kv_cache import ring_blocks_needed  # noqa: E402

from fs_common import AIMS, Bench, GIB, MAX_DRAFTS, log, med, time_graph  # noqa: E402
from fs_steps import cache_bytes_per_session, make_cache, measure_step, step_fn, step_meta  # noqa: E402


# Memory a decode step needs beside its cache (activations, logits, graph pools: 64 streams'
# logits are 32 MiB): an H100 ran 64 x 8k (a 4.22 GiB cache) with 4.36 GiB free after the
# full-size weights (bench/results/h100-2026-12-07b/hx/). A context that still runs out of
# memory is noted and the next one runs.
DECODE_RESERVE_GIB = 0.125


# =============================================================================== parts
def part_decode(b: Bench) -> None:
    s = b.sizes
    res = b.results.setdefault("decode", {"rows": []})
    res["definition"] = ("one decode step: PluginModel.forward over S streams x 1 token, "
                         "logits of every row, CUDA graph; context = seq_len (cached + the new "
                         "token); full-layer KV rotated INT4, sliding FP8")
    for ctx in s.contexts:
        if not b.enough(20, f"decode ctx {ctx}"):
            break
        streams = fitting_streams(b, "hadamard-int4", ctx, s.streams)
        if not streams:
            continue
        try:
            decode_context(b, res, ctx, streams)
        except torch.cuda.OutOfMemoryError as exc:
            what = f"decode ctx {ctx}: out of memory at {max(streams)} streams: {str(exc)[:160]}"
            log(f"SKIP {what}")
            b.results.setdefault("skipped", []).append(what)
        b.free()
    if b.cuda and not b.args.tiny and b.bs != 16 and b.enough(20, "decode block 16"):
        # the runtime's default block size (EngineArgs.block_size = 16), one point
        keep = b.bs
        b.bs, b.ring = 16, ring_blocks_needed(b.cfg.sliding_window, 1 + MAX_DRAFTS, 16)
        try:
            cache = make_cache(b, "hadamard-int4", 16, 32768)
            res["block16"] = measure_step(b, cache, 16, 1, 32768, attrib=False, eager=False,
                                          label="decode bs16")
            del cache
        finally:
            b.bs, b.ring = keep, ring_blocks_needed(b.cfg.sliding_window, 1 + MAX_DRAFTS, keep)
            b.free()
    b.save()


def decode_context(b: Bench, res: dict, ctx: int, streams: list[int]) -> None:
    """part_decode's rows at one context: one cache for the most streams, each count timed."""
    cache = make_cache(b, "hadamard-int4", max(streams), ctx)
    for n in streams:
        if not b.enough(10, f"decode {n}x{ctx}"):
            break
        row = measure_step(b, cache, n, 1, ctx, attrib=not b.args.no_attrib,
                           eager=not b.args.no_eager, label="decode")
        aim = AIMS["step_vs_floor_1"] if n == 1 else \
            AIMS["step_vs_floor_64"] if n == 64 else None
        if aim is not None:
            row["aim_ratio"], row["aim_met"] = aim, row["ratio"] <= aim
        res["rows"].append(row)
        b.save()


def fitting_streams(b: Bench, fmt: str, ctx: int, streams) -> list[int]:
    """The stream counts whose cache at `ctx` positions fits the GPU's free memory less
    DECODE_RESERVE_GIB (all of them on CPU); the others are noted in results["skipped"] (an
    H100 has ~4.4 GiB free beside the full-size weights: no 64 streams at 32k, 12.2 GiB)."""
    if not b.cuda:
        return list(streams)
    b.free()
    budget = torch.cuda.mem_get_info()[0] - int(DECODE_RESERVE_GIB * GIB)
    per = cache_bytes_per_session(b, fmt, ctx)
    keep = [n for n in streams if n * per <= budget]
    for n in streams:
        if n not in keep:
            what = (f"decode {n}x{ctx}: cache {n * per / GIB:.2f} GiB > {budget / GIB:.2f} GiB "
                    f"free less the reserve")
            log(f"SKIP {what}")
            b.results.setdefault("skipped", []).append(what)
    return keep


def part_verify(b: Bench) -> None:
    s = b.sizes
    res = b.results.setdefault("verify", {"rows": []})
    res["definition"] = (f"one verification pass: S streams x (1 + k) tokens at context "
                         f"{s.verify_context} (cached {s.verify_context - 1} + the new tokens), "
                         "logits of every row, CUDA graph, exact shapes (PluginRunner would pad "
                         "1 + k to a power of two)")
    cache = make_cache(b, "hadamard-int4", max(s.verify_streams),
                       s.verify_context + MAX_DRAFTS)
    for n in s.verify_streams:
        base = None
        for k in s.verify_k:
            q = 1 + k
            if not b.enough(10, f"verify {n}x{q}"):
                break
            row = measure_step(b, cache, n, q, s.verify_context - 1 + q,
                               attrib=q in s.verify_attrib_q and not b.args.no_attrib,
                               eager=not b.args.no_eager, label="verify")
            row["k"] = k
            if k == 0:
                base = row["graph_ms"]
            if base:
                row["vs_1token"] = row["graph_ms"] / base
                log(f"    1 + {k}: {row['vs_1token']:.3f}x the 1-token step")
            if n == 1 and q == 4 and base:
                row["aim_ratio"] = AIMS["verify4_vs_step_1"]
                row["aim_met"] = row["vs_1token"] <= row["aim_ratio"]
            res["rows"].append(row)
            b.save()
    del cache
    b.free()


def part_kv(b: Bench) -> None:
    s, cfg = b.sizes, b.cfg
    res = b.results.setdefault("kv", {"contexts": {}})
    b.free()
    if b.cuda:
        free, total = torch.cuda.mem_get_info()
        budget = free - int(b.args.reserve_gib * GIB)
    else:
        free, total, budget = 0, 0, int(b.args.kv_budget_mib * (1 << 20))
    res.update(device_total_bytes=total, free_after_weights_bytes=free,
               reserve_bytes=int(b.args.reserve_gib * GIB) if b.cuda else 0,
               cache_budget_bytes=budget, weight_bytes=b.results["meta"].get("weight_bytes"),
               max_streams_cap=b.args.kv_max_streams, block_size=b.bs, ring_blocks=b.ring,
               definition=("sessions = floor(cache budget / bytes per session); a session of "
                           "context L holds L positions in each full layer (whole blocks) and "
                           "a ring of window + 1 + 8 positions (whole blocks) in each sliding "
                           "layer; budget = free memory after the weights - reserve "
                           "(activations, graphs, attention partials)"))
    log(f"kv: budget {budget / GIB:.1f} GiB (free {free / GIB:.1f} GiB, reserve "
        f"{b.args.reserve_gib} GiB)")
    for ctx in s.kv_contexts:
        row = {}
        for fmt in ("hadamard-int4", "fp8"):
            per = cache_bytes_per_session(b, fmt, ctx)
            row[fmt] = dict(bytes_per_session=per, sessions=budget // per,
                            bytes_per_token_full_layers=bytes_per_token(cfg, fmt)
                            * sum(not cfg.is_sliding(i) for i in range(cfg.num_hidden_layers)))
        gain = row["hadamard-int4"]["sessions"] / max(1, row["fp8"]["sessions"]) - 1
        row["int4_sessions_gain"] = gain
        if ctx == 65536:
            row["aim_gain"], row["aim_met"] = AIMS["int4_sessions_gain_64k"], \
                gain >= AIMS["int4_sessions_gain_64k"]
        log(f"kv {ctx}: sessions INT4 {row['hadamard-int4']['sessions']}, FP8 "
            f"{row['fp8']['sessions']} ({100 * gain:+.1f} %)")
        res["contexts"][str(ctx)] = row
        b.save()
    for ctx in s.kv_contexts:
        row = res["contexts"][str(ctx)]
        plan = [("hadamard-int4", None), ("fp8", None)]
        plan.append(("hadamard-int4", min(row["fp8"]["sessions"], b.args.kv_max_streams)))
        for fmt, forced in plan:
            n = forced if forced is not None else min(row[fmt]["sessions"],
                                                       b.args.kv_max_streams)
            key = "decode" if forced is None else "decode_at_fp8_batch"
            if n < 1 or not b.enough(40, f"kv decode {fmt} {ctx}"):
                continue
            try:
                row[fmt][key] = full_memory_decode(b, fmt, n, ctx)
            except torch.cuda.OutOfMemoryError as exc:
                row[fmt][key] = {"error": f"out of memory at {n} streams: {str(exc)[:200]}"}
                log(f"kv {fmt} {ctx}: out of memory at {n} streams")
            b.free()
            b.save()
        i4, f8 = row["hadamard-int4"].get("decode", {}), row["fp8"].get("decode", {})
        if "tokens_per_s" in i4 and "tokens_per_s" in f8:
            row["int4_tokens_per_s_gain"] = i4["tokens_per_s"] / f8["tokens_per_s"] - 1
            log(f"kv {ctx}: decode at full memory INT4 {i4['tokens_per_s']:.0f} tok/s "
                f"({i4['streams']} streams), FP8 {f8['tokens_per_s']:.0f} tok/s "
                f"({f8['streams']} streams): {100 * row['int4_tokens_per_s_gain']:+.1f} %")
    b.save()


def full_memory_decode(b: Bench, fmt: str, n: int, ctx: int) -> dict:
    cache = make_cache(b, fmt, n, ctx)
    try:
        meta = step_meta(b, cache, n, 1, ctx)
        fn = step_fn(b, cache, meta)
        fn()
        b.sync()
        ms = med(time_graph(b, fn, max(3, b.sizes.replays // 2)))
    finally:
        del cache
    out = dict(streams=n, step_ms=ms, tokens_per_s=n / (ms * 1e-3),
               cache_bytes=n * cache_bytes_per_session(b, fmt, ctx))
    log(f"  kv decode {fmt} {n} streams @ {ctx}: {ms:.2f} ms/step, "
        f"{out['tokens_per_s']:.0f} tok/s")
    return out

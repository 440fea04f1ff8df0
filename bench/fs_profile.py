"""bench/fullsize.py, the profile part: which GPU kernels one eager decode step launches and
how long each takes (torch.profiler, CUDA activity), to name what the attribution's 'rest'
(everything outside the plugin kernels) is made of."""

from __future__ import annotations

import torch

import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from fs_common import Bench, log  # noqa: E402
from fs_steps import make_cache, step_fn, step_meta  # noqa: E402

PROFILE_POINTS = ((1, 8192), (64, 8192))  # (streams, context in tokens)
TOP = 25  # kernels listed per point


def part_profile(b: Bench) -> None:
    """Per (streams, context) of PROFILE_POINTS: kernel name, calls per step, total device
    ms per step, sorted by time; plus the sum of all kernels' device time per step (ms)."""
    res = b.results.setdefault("profile", {"points": []})
    if not b.cuda:
        log("profile: needs CUDA (torch.profiler CUDA activity); skipped")
        return
    from torch.profiler import ProfilerActivity, profile
    steps = 3
    for streams, ctx in PROFILE_POINTS:
        if not b.enough(20, f"profile {streams}x{ctx}"):
            break
        cache = make_cache(b, "hadamard-int4", streams, ctx)
        fn = step_fn(b, cache, step_meta(b, cache, streams, 1, ctx))
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn()
            torch.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            dev_us = getattr(e, "device_time_total", None)
            if dev_us is None:
                dev_us = e.cuda_time_total
            if dev_us > 0:
                rows.append(dict(kernel=e.key[:120], calls_per_step=e.count / steps,
                                 ms_per_step=dev_us / steps / 1e3))
        rows.sort(key=lambda r: -r["ms_per_step"])
        total = sum(r["ms_per_step"] for r in rows)
        res["points"].append(dict(streams=streams, context=ctx, kernels_ms_per_step=total,
                                  kernel_launches_per_step=sum(r["calls_per_step"] for r in rows),
                                  top=rows[:TOP]))
        log(f"profile {streams} x {ctx}: {total:.3f} ms of kernels per eager step, "
            f"{res['points'][-1]['kernel_launches_per_step']:.0f} launches")
        for r in rows[:TOP]:
            log(f"    {r['ms_per_step']:8.3f} ms {r['calls_per_step']:6.0f}x  {r['kernel'][:90]}")
        del cache, fn
        b.free()
        b.save()

#!/usr/bin/env python3
"""Can this machine capture a torch.distributed NCCL all_reduce inside a CUDA graph?

TP2 with CUDA graphs (bench/tp_check.py, tp2-graphs) did not finish on 2xH200 while eager TP2
ran; this isolates the collective. Two ranks (spawned), each: a few eager all_reduces, then
one capture per variant, then replays checked against the eager result, every step under a
timeout so that a hang is reported instead of blocking the call.

    python3 bench/nccl_graph_check.py --out DIR [--timeout 60]

Variants: "plain" (capture on a side stream, default capture_error_mode "global"),
"thread_local" (capture_error_mode="thread_local": other threads, e.g. the NCCL watchdog,
may query events during capture; pytorch/pytorch#104555), "pool" (two graphs sharing a
memory pool, as PluginRunner.capture_all does). Results: DIR/nccl_graph_check.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VARIANTS = ("plain", "thread_local", "pool")


def _capture(fn, mode: str, pool=None) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    kwargs = {"capture_error_mode": "thread_local"} if mode == "thread_local" else {}
    with torch.cuda.graph(graph, pool=pool, **kwargs):
        fn()
    return graph


def _variant(name: str, rank: int) -> dict:
    """Capture x += all_reduce(x) style work and replay it twice; compare with eager."""
    x = torch.full((4096,), float(rank + 1), device="cuda")
    y = torch.empty_like(x)

    def step():
        y.copy_(x * 2)
        dist.all_reduce(y)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()                                   # warm-up: communicator exists
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    want = y.clone()
    t0 = time.time()
    pool = torch.cuda.graph_pool_handle() if name == "pool" else None
    graphs = [_capture(step, "thread_local" if name != "plain" else "plain", pool)]
    if name == "pool":
        graphs.append(_capture(step, "thread_local", pool))
    capture_s = time.time() - t0
    ok = True
    for g in graphs * 2:
        y.zero_()
        g.replay()
        torch.cuda.synchronize()
        ok &= torch.equal(y, want)
    return {"ok": bool(ok), "capture_s": capture_s, "value": float(y[0])}


def _worker(rank: int, port: int, timeout: float, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank),
                            timeout=datetime.timedelta(seconds=timeout))
    for name in VARIANTS:
        try:
            queue.put((rank, name, _variant(name, rank)))
        except Exception as e:  # report, keep going with the next variant
            queue.put((rank, name, {"ok": False, "error": repr(e)[:2000]}))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per variant")
    args = ap.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("needs 2 GPUs")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, args.timeout, queue)) for r in range(2)]
    for p in procs:
        p.start()
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    results: dict = {"torch": torch.__version__, "nccl": nccl, "variants": {}}
    deadline = time.time() + args.timeout * len(VARIANTS) + 60
    while len(results["variants"]) < 2 * len(VARIANTS) and time.time() < deadline:
        try:
            rank, name, res = queue.get(timeout=max(1.0, deadline - time.time()))
        except Exception:
            break
        results["variants"][f"{name}/rank{rank}"] = res
        print(name, rank, res, flush=True)
    missing = [f"{n}/rank{r}" for n in VARIANTS for r in range(2)
               if f"{n}/rank{r}" not in results["variants"]]
    results["timed_out"] = missing
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nccl_graph_check.json").write_text(json.dumps(results, indent=1))
    print("timed out:", missing)
    return 0 if not missing and all(v.get("ok") for v in results["variants"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

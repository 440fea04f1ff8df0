"""Load test of a running `kolibri-trt serve` (loopback only): concurrent streaming chat
clients, a share of them disconnecting mid-stream and some sending malformed bodies.

Checks that every request completes or gets a clear error (a malformed body: 400 naming the
field), that completed outputs equal offline `LLM.generate` ones (with --engine: the same
engine folder, same prompts and seeds), and that afterwards no KV block is still allocated
(read from /metrics). Prints requests/s, tokens/s and p50/p99 time to first token.

    kolibri-trt serve --engine engines/gb10 --port 8000 &
    python bench/serve_load.py --url http://127.0.0.1:8000 --engine engines/gb10 \\
        [--clients 64] [--requests 64] [--max-tokens 16] [--disconnect-fraction 0.25] \\
        [--malformed-fraction 0.1] [--api-key KEY] [--json out.json]

Every loop is bounded (a request count and per-request / overall timeouts); the only
addresses it talks to are the loopback URL given.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1].parent / "shared/data/prompts"
TEMPERATURE = 0.8

# (field the 400 must name, body change) for malformed requests; None: broken JSON
MALFORMED = [
    ("body", None),
    ("max_tokens", {"max_tokens": 0}),
    ("temperature", {"temperature": "hot"}),
    ("n", {"n": 2}),
    ("messages[0].role", {"messages": [{"role": "robot", "content": "hi"}]}),
    ("max_tokens", {"max_tokens": "many"}),
    ("best_of", {"best_of": 3}),
]


@dataclass
class Job:
    """One request: kind "complete" | "disconnect" (leaves after its first token) |
    "malformed" (must get a 400 naming `expect_field`)."""

    index: int
    kind: str
    body: dict | None           # None: a broken JSON body
    expect_field: str | None = None

    def payload(self) -> bytes:
        if self.body is None:
            return b'{"model": "x", "messages": [{"role": "user", "content": '
        return json.dumps(self.body).encode()


@dataclass
class Result:
    index: int
    kind: str
    status: int | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    ttft_s: float | None = None
    latency_s: float = 0.0
    error: str | None = None


def is_loopback_url(url: str) -> bool:
    """True when the URL's host is a loopback address (127.0.0.0/8, ::1, localhost)."""
    host = urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def make_jobs(prompts: list[str], n: int, model: str, max_tokens: int,
              disconnect_fraction: float, malformed_fraction: float, seed: int = 0) -> list[Job]:
    """`n` jobs over the prompts (cycled), kinds shuffled with a fixed seed. A disconnecting
    client asks for 4x max_tokens so that it really leaves mid-stream."""
    n_bad = round(n * malformed_fraction)
    n_gone = round(n * disconnect_fraction)
    kinds = ["malformed"] * n_bad + ["disconnect"] * n_gone + ["complete"] * (n - n_bad - n_gone)
    random.Random(seed).shuffle(kinds)
    jobs = []
    for i, kind in enumerate(kinds):
        body = {"model": model, "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                "max_tokens": max_tokens * (4 if kind == "disconnect" else 1),
                "temperature": TEMPERATURE, "seed": seed + i, "stream": True,
                "return_token_ids": True}
        if kind != "malformed":
            jobs.append(Job(i, kind, body))
            continue
        expect, change = MALFORMED[i % len(MALFORMED)]
        jobs.append(Job(i, kind, None if change is None else body | change, expect))
    return jobs


async def run_job(client: httpx.AsyncClient, base_url: str, job: Job, headers: dict) -> Result:
    """Send one streaming chat request and read its events (a disconnecting job closes the
    connection after its first token)."""
    res, t0 = Result(job.index, job.kind), time.perf_counter()
    try:
        async with client.stream("POST", f"{base_url}/v1/chat/completions",
                                 content=job.payload(), headers=headers) as r:
            res.status = r.status_code
            if r.status_code != 200:
                res.error = _error_message(await r.aread())
            else:
                await _read_events(r, job, res, t0)
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.latency_s = time.perf_counter() - t0
    return res


async def _read_events(r: httpx.Response, job: Job, res: Result, t0: float) -> None:
    async for line in r.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return
        chunk = json.loads(line[6:])
        if "error" in chunk:
            res.error = chunk["error"]["message"]
            return
        for choice in chunk["choices"]:
            ids = choice.get("token_ids") or []
            if ids and res.ttft_s is None:
                res.ttft_s = time.perf_counter() - t0
            res.token_ids += ids
            res.text += choice["delta"].get("content") or ""
            res.finish_reason = choice.get("finish_reason") or res.finish_reason
        if job.kind == "disconnect" and res.token_ids:
            return                      # leaving the `stream` block closes the connection


def _error_message(body: bytes) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


async def run_load(base_url: str, jobs: list[Job], clients: int, api_key: str | None = None,
                   timeout_s: float = 600.0) -> tuple[list[Result], float]:
    """Run the jobs with `clients` concurrent connections. Returns (results in job order,
    wall seconds). Each request has `timeout_s` to finish (read timeout: 10 minutes)."""
    if not is_loopback_url(base_url):
        raise ValueError(f"url: {base_url} is not a loopback address")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    todo: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        todo.put_nowait(job)
    results: dict[int, Result] = {}
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0),
                                 limits=limits) as client:
        async def worker() -> None:
            while not todo.empty():
                job = todo.get_nowait()
                results[job.index] = await run_job(client, base_url, job, headers)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return [results[j.index] for j in jobs], wall


def read_metrics(base_url: str, timeout_s: float = 30.0) -> dict[str, float]:
    """GET /metrics as {sample name (with labels): value}."""
    text = httpx.get(f"{base_url}/metrics", timeout=timeout_s).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def wait_idle(base_url: str, timeout_s: float = 60.0) -> dict[str, float]:
    """Poll /metrics until no request runs or waits and no KV block is allocated (or the
    timeout passes); returns the last reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = read_metrics(base_url)
        idle = all(m.get(k) == 0 for k in ("kolibri_kv_cache_blocks_used",
                                            "kolibri_num_requests_running",
                                            "kolibri_num_requests_waiting",
                                            "kolibri_requests_in_flight"))
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def offline_tokens(llm, jobs: list[Job]) -> dict[int, list[int]]:
    """The tokens `llm.generate` (an `LLM` on the server's engine folder; its speculative
    mode does not change tokens) gives the complete jobs."""
    from kolibri_trt import SamplingParams

    todo = [j for j in jobs if j.kind == "complete"]
    ids = [llm.tokenizer.apply_chat_template(j.body["messages"]) for j in todo]
    params = [SamplingParams(max_tokens=j.body["max_tokens"], temperature=TEMPERATURE,
                             seed=j.body["seed"]) for j in todo]
    return {j.index: o.token_ids for j, o in zip(todo, llm.generate(ids, params))}


def check(results: list[Result], jobs: list[Job], offline: dict[int, list[int]] | None
          ) -> list[str]:
    """Problems found: a complete job that failed or differs from offline, a disconnecting
    job without a token, a malformed one without a 400 naming its field."""
    problems = []
    for res, job in zip(results, jobs):
        tag = f"request {job.index} ({job.kind})"
        if job.kind == "malformed":
            if res.status != 400 or job.expect_field not in (res.error or ""):
                problems.append(f"{tag}: expected 400 naming {job.expect_field!r}, got "
                                f"{res.status} {res.error!r}")
        elif res.status != 200 or res.error is not None or not res.token_ids:
            problems.append(f"{tag}: status {res.status}, error {res.error!r}")
        elif job.kind == "complete" and res.finish_reason is None:
            problems.append(f"{tag}: stream ended without finish_reason")
        elif job.kind == "complete" and offline is not None and res.token_ids != offline[job.index]:
            problems.append(f"{tag}: tokens differ from LLM.generate")
    return problems


def summarize(results: list[Result], wall: float) -> dict:
    """requests/s and tokens/s of completed requests over the wall time; time to first token
    (client side, to the first token-bearing chunk) over all streams that got one."""
    done = [r for r in results if r.kind == "complete" and r.finish_reason is not None]
    tokens = sum(len(r.token_ids) for r in results if r.kind != "malformed")
    ttft = sorted(r.ttft_s for r in results if r.ttft_s is not None)
    return {"requests": len(results), "completed": len(done),
            "disconnected": sum(r.kind == "disconnect" for r in results),
            "malformed": sum(r.kind == "malformed" for r in results),
            "wall_s": wall, "requests_per_s": len(done) / wall,
            "completion_tokens": tokens, "tokens_per_s": tokens / wall,
            "ttft_p50_s": _percentile(ttft, 50), "ttft_p99_s": _percentile(ttft, 99)}


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = (len(sorted_values) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--engine", type=Path, help="engine folder for the offline comparison")
    ap.add_argument("--prompts-file", type=Path,
                    default=DEFAULT_PROMPTS / "spec_bench_question.jsonl")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=None, help="default: --clients")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--disconnect-fraction", type=float, default=0.25)
    ap.add_argument("--malformed-fraction", type=float, default=0.1)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not is_loopback_url(args.url):
        print(f"serve_load: --url {args.url} is not a loopback address", file=sys.stderr)
        return 2
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from kolibri_trt.prompts import load_prompts

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        r = httpx.get(f"{args.url}/v1/models", headers=headers, timeout=30)
        r.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"serve_load: no server at {args.url}: {exc}", file=sys.stderr)
        return 2
    model = r.json()["data"][0]["id"]
    prompts = [p.text for p in load_prompts(args.prompts_file)]
    jobs = make_jobs(prompts, args.requests or args.clients, model, args.max_tokens,
                     args.disconnect_fraction, args.malformed_fraction)
    offline = None
    if args.engine is not None:
        t0 = time.perf_counter()
        from kolibri_trt import LLM
        offline = offline_tokens(LLM(args.engine, speculative="off", max_num_seqs=16), jobs)
        print(f"offline references: {len(offline)} requests in {time.perf_counter() - t0:.1f} s")
    results, wall = asyncio.run(run_load(args.url, jobs, args.clients, args.api_key,
                                         args.timeout))
    after = wait_idle(args.url)
    summary = summarize(results, wall)
    problems = check(results, jobs, offline)
    leftover = after.get("kolibri_kv_cache_blocks_used")
    if leftover != 0:
        problems.append(f"{leftover} KV blocks still allocated after the run")
    print(json.dumps(summary, indent=1))
    reasons = {k.split('"')[1]: int(v) for k, v in after.items()
               if k.startswith("kolibri_requests_finished_total{")}
    print(f"server: requests ended by reason {reasons}; KV blocks allocated after the run: "
          f"{leftover:g}; outputs compared with offline: {offline is not None}; "
          f"problems: {len(problems)}")
    for p in problems:
        print("  " + p)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "problems": problems,
                                         "results": [asdict(r) for r in results]}, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

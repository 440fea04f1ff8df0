"""Load on `kolibri-trt serve` (the small engine, 127.0.0.1 only, bounded): 32 concurrent
streaming chat clients get the tokens `LLM.generate` gives; with a quarter of them leaving
mid-stream and some sending malformed bodies, every request completes or gets a 400 naming
the field, and afterwards no KV block is allocated. The driver is bench/serve_load.py, which
runs the same test against a served default engine."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from kolibri_trt import LLM
from kolibri_trt.serving.openai_server import build_app

from test_openai_server import (KEY, MAX_MODEL_LEN, MODEL, ServerThread, metrics,
                                small_engine, small_engine_dir)
from test_runtime import PROMPTS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import serve_load  # noqa: E402

CLIENTS = 32


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    return small_engine_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def offline(engine_dir):
    return LLM(engine_dir, speculative="off", max_num_seqs=CLIENTS, max_model_len=MAX_MODEL_LEN,
               kv_cache_memory=64 << 20)


@pytest.fixture(scope="module")
def server(engine_dir):
    srv = ServerThread(build_app(small_engine(engine_dir, max_num_seqs=16), model_name=MODEL,
                                 api_key=KEY, max_waiting=2 * CLIENTS))
    yield srv
    srv.stop()


@pytest.mark.parametrize("disconnect, malformed", [(0.0, 0.0), (0.25, 0.125)])
def test_concurrent_streams_match_offline_and_free_every_block(server, offline, disconnect,
                                                               malformed):
    jobs = serve_load.make_jobs(PROMPTS, CLIENTS, MODEL, max_tokens=4,
                                disconnect_fraction=disconnect, malformed_fraction=malformed)
    want = serve_load.offline_tokens(offline, jobs)
    results, wall = asyncio.run(asyncio.wait_for(
        serve_load.run_load(server.url, jobs, CLIENTS, KEY, timeout_s=120), timeout=240))
    assert serve_load.check(results, jobs, want) == []
    after = serve_load.wait_idle(server.url, timeout_s=60)
    assert after["kolibri_kv_cache_blocks_used"] == 0
    assert after["kolibri_num_requests_running"] == after["kolibri_requests_in_flight"] == 0
    summary = serve_load.summarize(results, wall)
    n_gone, n_bad = round(CLIENTS * disconnect), round(CLIENTS * malformed)
    assert summary["completed"] == CLIENTS - n_gone - n_bad
    assert summary["ttft_p50_s"] is not None and summary["tokens_per_s"] > 0
    if n_gone:
        assert metrics(server.url)['kolibri_requests_finished_total{finish_reason="abort"}'] >= 1

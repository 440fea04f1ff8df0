"""Shared pieces of the Triton tests: the small engine, its LLM, helpers."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from kolibri_trt import LLM

from runtime_engines import small_target, write_engine

KV_BYTES = 64 << 20
TIMEOUT = 60.0  # seconds, for any one request


# ---- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Path:
    return write_engine(tmp_path_factory.mktemp("triton_engine"), small_target())


@pytest.fixture(scope="module")
def llm(engine):
    return LLM(engine, speculative="copy", kv_cache_memory=KV_BYTES)


def generate_on_worker(llm, prompts, params):
    """`llm.generate` on a worker thread, like the server's engine loop. (On the main thread,
    with torch's 2 OpenMP threads on a busy 2-core machine, the same call was measured up to
    ~150x slower: 188 s against 1.2 s for 8 prompts x 32 tokens.)"""
    out: list = []
    worker = threading.Thread(target=lambda: out.append(llm.generate(prompts, params)))
    worker.start()
    worker.join(10 * TIMEOUT)
    assert out, "llm.generate did not finish"
    return out[0]


def model_config(repo: Path, name: str = "kolibri") -> model_config_pb2.ModelConfig:
    return text_format.Parse((repo / name / "config.pbtxt").read_text(),
                             model_config_pb2.ModelConfig())



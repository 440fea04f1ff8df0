"""Prometheus metrics of the OpenAI-compatible server, one registry per app (several apps can
live in one process, as in the tests).

Engine state (requests running / waiting, KV blocks, pooled speculative-decoding counters) is
read from the engine when `/metrics` is scraped; request figures (tokens, time to first token,
latency, finish reasons, error statuses) are counted by the server as requests pass.
"""

from __future__ import annotations

import math
import time
from collections import deque

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..runtime.engine import LLMEngine
from ..spec.metrics import SOURCES

# CPU engines can take tens of seconds to a first token under load.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class ServerMetrics:
    """The metrics of one app. `window_s`: span of the tokens/s gauge."""

    def __init__(self, engine: LLMEngine, window_s: float = 10.0):
        self.registry = CollectorRegistry()
        r = self.registry
        self.generation_tokens = Counter("kolibri_generation_tokens",
                                         "Tokens generated for HTTP requests", registry=r)
        self.prompt_tokens = Counter("kolibri_prompt_tokens",
                                     "Prompt tokens of admitted HTTP requests", registry=r)
        self.finished = Counter("kolibri_requests_finished",
                                "Requests ended, by finish reason (stop, length, abort, error)",
                                ["finish_reason"], registry=r)
        self.errors = Counter("kolibri_http_errors", "Error responses, by HTTP status",
                              ["status"], registry=r)
        self.in_flight = Gauge("kolibri_requests_in_flight",
                               "Generation requests accepted and not yet ended", registry=r)
        self.ttft = Histogram("kolibri_time_to_first_token_seconds",
                              "From request arrival to its first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("kolibri_e2e_request_latency_seconds",
                                 "From request arrival to its last token",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.window_s = window_s
        self._recent: deque[tuple[float, int]] = deque()
        r.register(_EngineCollector(engine, self))

    def add_tokens(self, n: int) -> None:
        """Count `n` generated tokens (called on the event loop thread)."""
        if n:
            self.generation_tokens.inc(n)
            self._recent.append((time.monotonic(), n))

    def tokens_per_second(self) -> float:
        """Generated tokens per second over the last `window_s` seconds."""
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()
        return sum(n for _, n in self._recent) / self.window_s

    def render(self) -> bytes:
        """The text exposition format of every metric of this app."""
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """Reads the engine's scheduler, cache and pooled speculative counters at scrape time."""

    def __init__(self, engine: LLMEngine, server: ServerMetrics):
        self.engine, self.server = engine, server

    def collect(self):
        u = self.engine.usage()
        yield _gauge("kolibri_num_requests_running", "Requests in the running batch", u["running"])
        yield _gauge("kolibri_num_requests_waiting", "Requests waiting for admission",
                     u["waiting"])
        yield _gauge("kolibri_kv_cache_blocks_used", "Full-layer KV blocks allocated",
                     u["kv_blocks_used"])
        yield _gauge("kolibri_kv_cache_blocks_total", "Full-layer KV blocks in the cache",
                     u["kv_blocks_total"])
        yield _gauge("kolibri_kv_cache_usage_ratio", "Fraction of full-layer KV blocks in use",
                     u["kv_blocks_used"] / max(1, u["kv_blocks_total"]))
        yield _gauge("kolibri_generation_tokens_per_second",
                     f"Generated tokens per second over the last {self.server.window_s:g} s",
                     self.server.tokens_per_second())
        yield from self._spec()

    def _spec(self):
        s = self.engine.stats
        proposed = CounterMetricFamily("kolibri_spec_draft_tokens",
                                       "Draft tokens proposed, by source", labels=["source"])
        accepted = CounterMetricFamily("kolibri_spec_accepted_tokens",
                                       "Draft tokens accepted, by source", labels=["source"])
        for src in SOURCES:
            proposed.add_metric([src], s.proposed[src])
            accepted.add_metric([src], s.accepted[src])
        yield proposed
        yield accepted
        yield CounterMetricFamily("kolibri_spec_target_passes",
                                  "Target passes that produced tokens", value=s.target_passes)
        yield CounterMetricFamily("kolibri_spec_committed_tokens",
                                  "Tokens committed by those passes", value=s.tokens)
        tau = s.acceptance_length
        yield _gauge("kolibri_spec_acceptance_length",
                     "Tokens per target pass since start (tau; NaN before the first pass)",
                     math.nan if tau is None else tau)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)

"""`kolibri-trt serve`: the official OpenAI client gets `LLM.generate`'s tokens (completions,
chat, streaming); bad requests get a 400 naming the field; the API key, the bounded queue, and
clients that go away (their KV blocks come back). Servers run in-process on 127.0.0.1 only."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.cli import build_parser
from kolibri_trt.runtime.engine import EngineArgs, LLMEngine
from kolibri_trt.serving.openai_protocol import (ChatCompletionRequest, CompletionRequest,
                                                 sampling_params)
from kolibri_trt.serving.openai_server import build_app

from runtime_engines import small_target, write_engine
from test_runtime import PROMPTS

KEY, MODEL, MAX_MODEL_LEN = "test-key", "kolibri-small", 256
AUTH = {"Authorization": f"Bearer {KEY}"}


def small_engine_dir(tmp_path_factory) -> Path:
    """The small engine (vocab 2000), built once per test session."""
    folder = tmp_path_factory.getbasetemp() / "openai-engine"
    engine = folder / "engine-bf16-bf16"
    if not (engine / "manifest.json").is_file():
        write_engine(folder, small_target())
    return engine


def small_engine(engine_dir: Path, max_num_seqs: int = 8) -> LLMEngine:
    return LLMEngine(engine_dir, "copy", EngineArgs(max_num_seqs=max_num_seqs,
                                                    max_model_len=MAX_MODEL_LEN,
                                                    kv_cache_memory=64 << 20))


class ServerThread:
    """uvicorn serving `app` on a free port of 127.0.0.1 in a thread, until `stop()`."""

    def __init__(self, app, timeout_s: float = 60.0):
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "server did not stop"


def metrics(url: str) -> dict[str, float]:
    """/metrics samples as {name or name{labels}: value}."""
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_for(url: str, condition, timeout_s: float = 60.0) -> dict[str, float]:
    """Poll /metrics until `condition(metrics)` holds; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(url)
        if condition(m):
            return m
        assert time.monotonic() < deadline, f"timed out; last metrics: {m}"
        time.sleep(0.05)


def idle(m: dict[str, float]) -> bool:
    return (m["kolibri_kv_cache_blocks_used"] == 0 and m["kolibri_num_requests_running"] == 0
            and m["kolibri_num_requests_waiting"] == 0 and m["kolibri_requests_in_flight"] == 0)


ABORTED = 'kolibri_requests_finished_total{finish_reason="abort"}'


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    return small_engine_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def offline(engine_dir):
    return LLM(engine_dir, speculative="off", max_model_len=MAX_MODEL_LEN,
               kv_cache_memory=64 << 20)


@pytest.fixture(scope="module")
def server(engine_dir):
    srv = ServerThread(build_app(small_engine(engine_dir), model_name=MODEL, api_key=KEY))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.mark.parametrize("prompt, kwargs, params", [
    (PROMPTS[0], {"max_tokens": 10, "temperature": 0}, SamplingParams(max_tokens=10)),
    (PROMPTS[1], {"max_tokens": 12, "temperature": 0.8, "seed": 3},
     SamplingParams(max_tokens=12, temperature=0.8, seed=3)),
    (PROMPTS[2], {"seed": 5}, SamplingParams(max_tokens=16, temperature=1.0, seed=5)),
    (PROMPTS[3], {"max_tokens": 12, "temperature": 0.7, "top_p": 0.9, "seed": 1,
                  "extra_body": {"top_k": 50, "ignore_eos": True}},
     SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9, top_k=50, seed=1,
                    ignore_eos=True)),
])
def test_completions_match_llm_generate(client, offline, prompt, kwargs, params):
    kwargs = dict(kwargs)
    extra = kwargs.pop("extra_body", {}) | {"return_token_ids": True}
    r = client.completions.create(model=MODEL, prompt=prompt, extra_body=extra, **kwargs)
    want = offline.generate(prompt, params)[0]
    choice = r.choices[0]
    assert (choice.token_ids, choice.text, choice.finish_reason) == (
        want.token_ids, want.text, want.finish_reason)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (
        len(want.prompt_token_ids), len(want.token_ids))
    spec = r.kolibri_metrics["spec"]
    assert spec["target_passes"] >= 1 and set(spec["proposed"]) == {"copy", "drafter_row0",
                                                                    "drafter_rows1+"}


def test_a_stop_string_and_streamed_completions(client, offline):
    full = offline.generate(PROMPTS[4], SamplingParams(max_tokens=24, temperature=0.9, seed=7))[0]
    stop = full.text[len(full.text) // 2:][:2]
    params = SamplingParams(max_tokens=24, temperature=0.9, seed=7, stop=[stop])
    want = offline.generate(PROMPTS[4], params)[0]
    chunks = list(client.completions.create(model=MODEL, prompt=[PROMPTS[4]], max_tokens=24,
                                            temperature=0.9, seed=7, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason == "stop"
    assert chunks[-1].kolibri_metrics["num_generated_tokens"] == len(want.token_ids)


def test_stop_token_ids_match_llm_generate(client, offline):
    full = offline.generate(PROMPTS[5], SamplingParams(max_tokens=12, temperature=0.9, seed=4))[0]
    params = SamplingParams(max_tokens=12, temperature=0.9, seed=4,
                            stop_token_ids=[full.token_ids[2]])
    want = offline.generate(PROMPTS[5], params)[0]
    r = client.completions.create(model=MODEL, prompt=PROMPTS[5], max_tokens=12, temperature=0.9,
                                  seed=4, extra_body={"stop_token_ids": [full.token_ids[2]],
                                                      "return_token_ids": True})
    assert r.choices[0].token_ids == want.token_ids == full.token_ids[:3]
    assert r.choices[0].finish_reason == "stop"


def test_openai_defaults_map_to_sampling_params():
    chat = ChatCompletionRequest.model_validate_json(
        '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_k": -1}')
    params = sampling_params(chat, prompt_len=200, max_model_len=256, default_max_tokens=256)
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (56, 1.0, 1.0, 0)
    done = CompletionRequest.model_validate_json('{"model": "m", "prompt": ["hi"], "stop": "x"}')
    params = sampling_params(done, prompt_len=3, max_model_len=256, default_max_tokens=16)
    assert (done.prompt, params.max_tokens, params.stop) == ("hi", 16, ("x",))


def test_chat_and_streamed_chat_match_llm_chat(client, offline):
    messages = [{"role": "system", "content": "Antworte kurz."},
                {"role": "user", "content": "Wie heißt die Hauptstadt von Österreich?"}]
    want = offline.chat(messages, SamplingParams(max_tokens=14, temperature=0.8, seed=9))[0]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=14,
                                       temperature=0.8, seed=9)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (want.text,
                                                                          want.finish_reason)
    assert r.usage.completion_tokens == len(want.token_ids)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=14, temperature=0.8, seed=9,
        stream=True, stream_options={"include_usage": True}, extra_body={"return_token_ids": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert [t for c in chunks if c.choices for t in c.choices[0].token_ids] == want.token_ids
    assert chunks[-2].choices[0].finish_reason == want.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_models_health_metrics_and_the_api_key(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert "kolibri_spec_accepted_tokens_total" in httpx.get(f"{server.url}/metrics").text
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    r = httpx.post(f"{server.url}/v1/chat/completions", content=b"{broken")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


LONG = "word " * 400


@pytest.mark.parametrize("path, body, status, field", [
    ("completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("completions", {"prompt": "hi", "logprobs": 2}, 400, "logprobs"),
    ("completions", {"prompt": LONG}, 400, "prompt"),
    ("completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("completions", {"prompt": "hi", "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("completions", {"prompt": "hi", "seed": -1}, 400, "seed"),
    ("completions", {"prompt": "hi", "ignore_eos": "yes"}, 400, "ignore_eos"),
    ("completions", {"prompt": [5, 99999]}, 400, "prompt"),
    ("completions", {}, 400, "prompt"),
    ("completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    ("chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0].role"),
    ("chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("chat/completions", b'{"model": "kolibri-small", "messages": [', 400, "body"),
    ("chat/completions", b"[1, 2]", 400, "body"),
])
def test_bad_requests_name_the_field(server, path, body, status, field):
    content = body if isinstance(body, bytes) else httpx.Request(
        "POST", "/", json={"model": MODEL} | body).content
    r = httpx.post(f"{server.url}/v1/{path}", content=content, headers=AUTH, timeout=60)
    err = r.json()["error"]
    assert r.status_code == status and err["param"] == field, err
    assert err["message"].startswith(field), err


def test_the_openai_client_reports_a_400(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=-3)


def _open_stream(http: httpx.Client, url: str, max_tokens: int):
    """Start a streaming completion; returns (context, its line iterator, first data line).
    Closing either one closes the connection."""
    ctx = http.stream("POST", f"{url}/v1/completions", headers=AUTH, json={
        "model": MODEL, "prompt": PROMPTS[1], "max_tokens": max_tokens, "ignore_eos": True,
        "stream": True, "return_token_ids": True})
    r = ctx.__enter__()
    assert r.status_code == 200
    lines = r.iter_lines()
    first = next(lines)
    while not first.startswith("data: "):
        first = next(lines)
    return ctx, lines, first


def test_a_client_leaving_mid_stream_frees_its_kv_blocks(server):
    before = metrics(server.url).get(ABORTED, 0)
    with httpx.Client(timeout=60) as http:
        ctx, _lines, first = _open_stream(http, server.url, MAX_MODEL_LEN - 40)
        assert '"token_ids":[' in first
        assert metrics(server.url)["kolibri_kv_cache_blocks_used"] > 0
        ctx.__exit__(None, None, None)            # closes the connection mid-stream
    m = wait_for(server.url, lambda m: idle(m) and m.get(ABORTED, 0) == before + 1)
    assert m["kolibri_kv_cache_blocks_used"] == 0


def test_a_client_leaving_a_whole_response_aborts_it(server):
    before = metrics(server.url).get(ABORTED, 0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=0.5, json={
            "model": MODEL, "prompt": PROMPTS[2], "max_tokens": MAX_MODEL_LEN - 40,
            "ignore_eos": True})
    wait_for(server.url, lambda m: idle(m) and m.get(ABORTED, 0) == before + 1)


def test_a_full_queue_answers_503_and_recovers(engine_dir):
    srv = ServerThread(build_app(small_engine(engine_dir, max_num_seqs=1), model_name=MODEL,
                                 api_key=KEY, max_waiting=1))
    try:
        with httpx.Client(timeout=60) as http:
            running, _lines, _ = _open_stream(http, srv.url, MAX_MODEL_LEN - 40)
            waiting = http.stream("POST", f"{srv.url}/v1/completions", headers=AUTH, json={
                "model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True})
            r_wait = waiting.__enter__()
            wait_for(srv.url, lambda m: m["kolibri_num_requests_waiting"] == 1)
            full = http.post(f"{srv.url}/v1/completions", headers=AUTH,
                             json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
            assert full.status_code == 503 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["code"] == "queue_full"
            running.__exit__(None, None, None)    # the running client leaves: B is admitted
            lines = [line for line in r_wait.iter_lines() if line.startswith("data: ")]
            waiting.__exit__(None, None, None)
            assert lines[-1] == "data: [DONE]" and '"finish_reason":"length"' in lines[-2]
        wait_for(srv.url, idle)
    finally:
        srv.stop()


def test_cli_serve_options():
    args = build_parser().parse_args(["serve", "--engine", "e", "--api-key", "k",
                                      "--speculative", "copy", "--max-waiting", "4"])
    assert (args.host, args.port, args.api_key, args.speculative, args.max_waiting) == (
        "127.0.0.1", 8000, "k", "copy", 4)

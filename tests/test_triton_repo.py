"""Triton Inference Server without a server: the model repository written by the build and by
`kolibri-trt triton-repo`, request decoding, and the front end with fake response senders.
(`test_triton_server.py` runs the same model in a real tritonserver.)"""

from __future__ import annotations

import filecmp
import threading
import time

import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from kolibri_trt import SamplingParams
from kolibri_trt.serving import EngineLoop
from kolibri_trt.serving.triton_frontend import (
    BadRequest,
    ModelClosing,
    TritonFrontEnd,
    decode_request,
    error_kind,
)
from kolibri_trt.serving.triton_repo import MODEL_FILE, ModelOptions, write_model_repository

from test_runtime import PROMPTS

from triton_support import (KV_BYTES, TIMEOUT, engine, generate_on_worker,  # noqa: F401
                            llm, model_config)


# ---- the repository ---------------------------------------------------------------------------
def test_repository_is_a_valid_decoupled_python_model(engine, tmp_path):
    repo = write_model_repository(tmp_path / "repo", ModelOptions(engine, speculative="copy"))
    cfg = model_config(repo)
    assert (cfg.name, cfg.backend, cfg.max_batch_size) == ("kolibri", "python", 1)
    assert cfg.model_transaction_policy.decoupled
    assert {i.name: model_config_pb2.DataType.Name(i.data_type) for i in cfg.input} == {
        "text_input": "TYPE_STRING", "max_tokens": "TYPE_INT32", "temperature": "TYPE_FP32",
        "top_p": "TYPE_FP32", "top_k": "TYPE_INT32", "random_seed": "TYPE_UINT64",
        "stop_words": "TYPE_STRING", "bad_words": "TYPE_STRING", "end_id": "TYPE_INT32",
        "pad_id": "TYPE_INT32", "stream": "TYPE_BOOL", "speculative": "TYPE_STRING"}
    assert [o.name for o in cfg.output] == ["text_output", "finish_reason", "acceptance_rate",
                                            "total_accepted_draft_tokens", "total_draft_tokens",
                                            "acceptance_length"]
    assert filecmp.cmp(repo / "kolibri" / "1" / "model.py", MODEL_FILE, shallow=False)
    # what Triton hands to initialize() (the config as JSON) gives back the options
    as_json = json_format.MessageToDict(cfg, preserving_proto_field_name=True)
    opts = ModelOptions.from_model_config(as_json)
    assert opts == ModelOptions(engine.resolve(), speculative="copy")


def test_repository_errors(engine, tmp_path):
    with pytest.raises(ValueError, match="speculative: unknown mode 'fast'"):
        ModelOptions(engine, speculative="fast")
    with pytest.raises(ValueError, match="max_num_seqs"):
        ModelOptions(engine, max_num_seqs=0)
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        write_model_repository(tmp_path / "r", ModelOptions(tmp_path))
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="--force"):
        write_model_repository(tmp_path / "taken", ModelOptions(engine))
    write_model_repository(tmp_path / "taken", ModelOptions(engine), force=True)
    assert (tmp_path / "taken" / "kolibri" / "config.pbtxt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no temporary left
    with pytest.raises(ValueError, match="unknown"):
        ModelOptions.from_model_config({"parameters": {"engine_dir": {"string_value": "x"},
                                                       "bogus": {"string_value": "1"}}})
    with pytest.raises(ValueError, match="speculative: unknown mode"):
        ModelOptions.from_model_config({"parameters": {"engine_dir": {"string_value": "x"},
                                                       "speculative": {"string_value": "y"}}})


def test_cli_triton_repo_and_build_option(engine, tmp_path):
    from kolibri_trt.builder.cli import main as build_main
    from kolibri_trt.cli import main

    assert main(["triton-repo", "--engine", str(engine), "--out", str(tmp_path / "a"),
                 "--speculative", "off", "--max-num-seqs", "4", "--instances", "2"]) == 0
    cfg = model_config(tmp_path / "a")
    assert cfg.parameters["speculative"].string_value == "off"
    assert cfg.parameters["max_num_seqs"].string_value == "4"
    assert cfg.instance_group[0].count == 2
    assert main(["triton-repo", "--engine", str(engine), "--out", str(tmp_path / "b"),
                 "--speculative", "fast"]) == 2
    # build.py --triton-repo: the same checkpoints and recipes as the engine fixture
    src = engine.parent
    argv = ["--target", "cpu", "--model", str(src / "ckpt" / "target"), "--drafter",
            str(src / "ckpt" / "drafter"), "--weights", "bf16", "--kv-cache", "bf16",
            "--out", str(tmp_path / "engine"), "--no-progress", "--recipes", str(src / "recipes"),
            "--triton-repo", str(tmp_path / "repo")]
    assert build_main(argv) == 0
    cfg = model_config(tmp_path / "repo")
    assert cfg.parameters["engine_dir"].string_value == str((tmp_path / "engine").resolve())
    assert cfg.parameters["speculative"].string_value == "copy+drafter"
    assert build_main(argv) == 2  # both exist: refused before building


# ---- requests, without a server ---------------------------------------------------------------
def _inputs(**values) -> dict[str, np.ndarray]:
    """Request tensors as a Triton client sends them (batch dimension 1)."""
    out = {}
    for name, v in values.items():
        if isinstance(v, np.ndarray):
            out[name] = v
        elif isinstance(v, (list, tuple)):
            out[name] = np.array([[x.encode() if isinstance(x, str) else x for x in v]],
                                 dtype=np.object_)
        elif isinstance(v, (str, bytes)):
            out[name] = np.array([[v.encode() if isinstance(v, str) else v]], dtype=np.object_)
        elif isinstance(v, bool):
            out[name] = np.array([[v]], dtype=bool)
        elif isinstance(v, float):
            out[name] = np.array([[v]], dtype=np.float32)
        elif name == "random_seed":
            out[name] = np.array([[v]], dtype=np.uint64)
        else:
            out[name] = np.array([[v]], dtype=np.int32)
    return out


def _decode(**values):
    return decode_request(_inputs(**values).get, "copy")


def test_decode_request():
    req = _decode(text_input="Grüß Gott!", max_tokens=7, temperature=0.5, top_p=0.9, top_k=5,
                  random_seed=2**64 - 1, stop_words=["", "\n\n"], bad_words=[""], stream=True,
                  end_id=3, pad_id=0, speculative="copy")
    assert req.prompt == "Grüß Gott!" and req.stream
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.stop) == (
        7, 0.5, pytest.approx(0.9), 5, 2**64 - 1, ("\n\n",))
    assert p.stop_token_ids == (3,) and p.ignore_eos
    req = _decode(text_input="x", max_tokens=1)
    assert not req.stream and req.params.greedy and req.params.stop == ()


@pytest.mark.parametrize("values, message", [
    ({"max_tokens": 4}, "text_input: required"),
    ({"text_input": "x"}, "max_tokens: required"),
    ({"text_input": "x", "max_tokens": -3}, "max_tokens: must be >= 1, got -3"),
    ({"text_input": "x", "max_tokens": 0}, "max_tokens: must be >= 1"),
    ({"text_input": b"\xff\xfe ok", "max_tokens": 4}, "text_input: not valid UTF-8"),
    ({"text_input": ["a", "b"], "max_tokens": 4}, "text_input: one value per request"),
    ({"text_input": "x", "max_tokens": 4, "speculative": "fast"},
     "speculative: unknown mode 'fast'"),
    ({"text_input": "x", "max_tokens": 4, "speculative": "drafter"},
     "speculative: this model serves 'copy'"),
    ({"text_input": "x", "max_tokens": 4, "temperature": -1.0}, "temperature: must be >= 0"),
    ({"text_input": "x", "max_tokens": 4, "temperature": float("nan")},
     "temperature: must be finite"),
    ({"text_input": "x", "max_tokens": 4, "top_p": 1.5}, "top_p: must be in"),
    ({"text_input": "x", "max_tokens": 4, "top_k": -1}, "top_k: must be >= 0"),
    ({"text_input": "x", "max_tokens": 4, "stop_words": [b"\xc3"]}, "stop_words: not valid UTF-8"),
    ({"text_input": "x", "max_tokens": 4, "bad_words": ["no"]}, "bad_words: not supported"),
    ({"text_input": "x", "max_tokens": np.array([[1.5]], np.float32)},
     "max_tokens: must be an integer"),
])
def test_decode_request_rejects(values, message):
    with pytest.raises(BadRequest, match=message.replace("(", r"\(")) as info:
        _decode(**values)
    assert error_kind(info.value) == "INVALID_ARG"


class FakeSender:
    """Records what the front end sends for one request."""

    def __init__(self, cancel_after: int | None = None):
        self.sent: list[tuple[dict | None, BaseException | None, bool]] = []
        self.done = threading.Event()
        self.cancel_after = cancel_after

    def send(self, outputs, error, final):
        assert not self.done.is_set(), "a response after the final one"
        self.sent.append((outputs, error, final))
        if final:
            self.done.set()

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after

    def text(self) -> str:
        return "".join(o["text_output"][0, 0].decode() for o, _, _ in self.sent if o)


def test_front_end_streams_batches_cancels_and_closes(llm):
    params = [SamplingParams(max_tokens=12, temperature=0.8, seed=40 + i, ignore_eos=True,
                             stop_token_ids=(1999,)) for i in range(4)]
    offline = generate_on_worker(llm, PROMPTS[:4], params)
    front = TritonFrontEnd(EngineLoop(llm.engine), "copy")
    try:
        senders = [FakeSender() for _ in range(4)]
        for i, s in enumerate(senders):
            front.submit(_inputs(text_input=PROMPTS[i], max_tokens=12, temperature=0.8,
                                 random_seed=40 + i, end_id=1999, stream=i % 2 == 0).get, s)
        for s in senders:
            assert s.done.wait(TIMEOUT)
        for i, (s, o) in enumerate(zip(senders, offline)):
            assert s.text() == o.text and all(e is None for _, e, _ in s.sent)
            last = s.sent[-1][0]
            assert last["finish_reason"][0, 0].decode() == o.finish_reason
            assert int(last["total_draft_tokens"][0, 0]) == sum(o.metrics.spec.proposed.values())
            assert len(s.sent) > 1 if i % 2 == 0 else len(s.sent) == 1  # pieces / one

        cancelled = FakeSender(cancel_after=1)
        front.submit(_inputs(text_input=PROMPTS[4], max_tokens=400, stream=True).get, cancelled)
        assert cancelled.done.wait(TIMEOUT)
        assert cancelled.sent[-1] == (None, None, True)
        for _ in range(500):
            if not llm.engine.has_unfinished():
                break
            time.sleep(0.01)
        assert llm.engine.usage()["kv_blocks_used"] == 0

        with pytest.raises(BadRequest, match="text_input: prompt"):
            front.submit(_inputs(text_input=" ".join(map(str, range(5000))),
                                 max_tokens=4).get, FakeSender())
        running = FakeSender()
        front.submit(_inputs(text_input=PROMPTS[3], max_tokens=4000, end_id=1999).get, running)
    finally:
        front.close()
    assert running.done.is_set() and isinstance(running.sent[-1][1], ModelClosing)
    assert error_kind(running.sent[-1][1]) == "UNAVAILABLE" and front.num_live() == 0
    with pytest.raises(ModelClosing):
        front.submit(_inputs(text_input="x", max_tokens=4).get, FakeSender())
    for rid in list(llm.engine.requests):
        llm.engine.abort(rid)

"""Triton Inference Server model repository for a kolibri-trt engine, and the request logic of
its Python-backend model (`triton_model.py`, copied into the repository as `1/model.py`).

    <repo>/kolibri/config.pbtxt   Python backend, decoupled; parameters: engine_dir,
                                  speculative, max_num_seqs, max_model_len, kv_cache_memory,
                                  max_waiting
    <repo>/kolibri/1/model.py     the thin model: decode the request, submit it to the
                                  instance's EngineLoop, send each step as a response

Tensor names are those of TensorRT-LLM's `ensemble` model, so its clients work unchanged:
inputs `text_input` (BYTES), `max_tokens` (INT32), optional `temperature`, `top_p` (FP32),
`top_k` (INT32), `random_seed` (UINT64), `stop_words` (BYTES list), `stream` (BOOL),
`bad_words` (BYTES, only empty accepted), `end_id` (INT32: replaces EOS as the stop token),
`pad_id` (INT32, ignored); plus `speculative` (BYTES: a request may name the served mode).
Outputs: `text_output` (BYTES: the generated text only, or with stream=true each delta),
`finish_reason` (BYTES: "stop" | "length", empty until the final response), and the
speculative-decoding metrics of the request so far, in TensorRT-LLM's names where it has them:
`acceptance_rate` (FP32), `total_accepted_draft_tokens`, `total_draft_tokens` (INT32),
`acceptance_length` (FP32, tokens per target pass).

Everything here runs without a Triton server, so it is unit-tested directly; only
`triton_model.py` imports `triton_python_backend_utils`.
"""

from __future__ import annotations

import itertools
import json
import math
import queue
import shutil
import tempfile
import threading
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from ..spec.speculator import MODES as SPECULATIVE_MODES

if TYPE_CHECKING:
    from ..sampling import SamplingParams

MODEL_NAME = "kolibri"
MODEL_FILE = Path(__file__).with_name("triton_model.py")

# (name, Triton data type, dims without the batch dimension); all declared optional so that a
# missing required input gets this model's own error message (naming the input).
INPUTS = (
    ("text_input", "TYPE_STRING", "[ 1 ]"),
    ("max_tokens", "TYPE_INT32", "[ 1 ]"),
    ("temperature", "TYPE_FP32", "[ 1 ]"),
    ("top_p", "TYPE_FP32", "[ 1 ]"),
    ("top_k", "TYPE_INT32", "[ 1 ]"),
    ("random_seed", "TYPE_UINT64", "[ 1 ]"),
    ("stop_words", "TYPE_STRING", "[ -1 ]"),
    ("bad_words", "TYPE_STRING", "[ -1 ]"),
    ("end_id", "TYPE_INT32", "[ 1 ]"),
    ("pad_id", "TYPE_INT32", "[ 1 ]"),
    ("stream", "TYPE_BOOL", "[ 1 ]"),
    ("speculative", "TYPE_STRING", "[ 1 ]"),
)
OUTPUTS = (
    ("text_output", "TYPE_STRING", "[ -1 ]"),
    ("finish_reason", "TYPE_STRING", "[ 1 ]"),
    ("acceptance_rate", "TYPE_FP32", "[ 1 ]"),
    ("total_accepted_draft_tokens", "TYPE_INT32", "[ 1 ]"),
    ("total_draft_tokens", "TYPE_INT32", "[ 1 ]"),
    ("acceptance_length", "TYPE_FP32", "[ 1 ]"),
)


class BadRequest(ValueError):
    """A request the model rejects; the message starts with the input's name."""


# ---- model options (config.pbtxt parameters) -------------------------------------------------
@dataclass(frozen=True)
class ModelOptions:
    """What one model instance serves. engine_dir: folder written by build.py; speculative:
    one of "off", "copy", "drafter", "copy+drafter"; max_num_seqs: streams decoded together
    (the continuous batch); max_waiting: requests queued beyond it before new ones get
    UNAVAILABLE; max_model_len, kv_cache_memory (bytes): see EngineArgs."""

    engine_dir: Path
    speculative: str = "copy+drafter"
    max_num_seqs: int = 8
    max_model_len: int = 4096
    kv_cache_memory: int = 1 << 30
    max_waiting: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine_dir", Path(self.engine_dir))
        if self.speculative not in SPECULATIVE_MODES:
            raise ValueError(f"speculative: unknown mode {self.speculative!r}; one of "
                             f"{list(SPECULATIVE_MODES)}")
        for name in ("max_num_seqs", "max_model_len", "kv_cache_memory", "max_waiting"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")

    @classmethod
    def from_model_config(cls, config: dict) -> ModelOptions:
        """From the model configuration Triton hands to `initialize` (parsed JSON).

        Raises:
            ValueError: a missing engine_dir, an unknown parameter or mode, a bad number.
        """
        params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ValueError(f"config.pbtxt parameters: unknown {unknown}; known {sorted(known)}")
        if not params.get("engine_dir"):
            raise ValueError("config.pbtxt parameters: engine_dir is missing")
        kwargs: dict = {}
        for key, text in params.items():
            if key in ("engine_dir", "speculative"):
                kwargs[key] = text
            else:
                try:
                    kwargs[key] = int(text)
                except ValueError:
                    raise ValueError(f"{key}: must be a positive int, got {text!r}") from None
        return cls(**kwargs)

    def parameters(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in fields(self)}


def config_pbtxt(options: ModelOptions, model_name: str = MODEL_NAME, instances: int = 1) -> str:
    """The model configuration: Python backend, decoupled, batch 1 per request (the engine
    batches requests itself), `instances` CPU instances each with its own engine."""
    def tensor(name: str, dtype: str, dims: str, optional: bool) -> str:
        opt = " optional: true" if optional else ""
        return f"  {{ name: \"{name}\" data_type: {dtype} dims: {dims}{opt} }}"

    def string(value: str) -> str:
        return json.dumps(value)  # a protobuf text string: JSON's escaping is valid there

    inputs = ",\n".join(tensor(n, t, d, True) for n, t, d in INPUTS)
    outputs = ",\n".join(tensor(n, t, d, False) for n, t, d in OUTPUTS)
    params = "\n".join(f"parameters {{ key: {string(k)} value: {{ string_value: {string(v)} }} }}"
                       for k, v in options.parameters().items())
    return (f"# written by kolibri-trt (kolibri_trt/serving/triton_repo.py)\n"
            f"name: {string(model_name)}\nbackend: \"python\"\nmax_batch_size: 1\n"
            f"model_transaction_policy {{ decoupled: true }}\n"
            f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
            f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n{params}\n")


def write_model_repository(out: str | Path, options: ModelOptions, model_name: str = MODEL_NAME,
                           instances: int = 1, force: bool = False) -> Path:
    """Write `<out>/<model_name>/{config.pbtxt, 1/model.py}`; the engine path is stored
    absolute. Written beside `out` and renamed, so no half-written repository is left.

    Raises:
        FileNotFoundError: engine_dir has no manifest.json.
        FileExistsError: `out` exists and `force` is not set.
        ValueError: a bad model name or instance count.
    """
    out = Path(out)
    engine = options.engine_dir.resolve()
    if not (engine / "manifest.json").is_file():
        raise FileNotFoundError(f"{engine / 'manifest.json'}: not an engine folder written by "
                                "build.py")
    if not model_name or not all(c.isalnum() or c in "-_." for c in model_name):
        raise ValueError(f"model_name: letters, digits, '-', '_', '.' only, got {model_name!r}")
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ValueError(f"instances: must be a positive int, got {instances!r}")
    if out.exists() and not force:
        raise FileExistsError(f"output folder {out} exists; pass --force to replace it")
    options = ModelOptions(**{**options.__dict__, "engine_dir": engine})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model = tmp / model_name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(config_pbtxt(options, model_name, instances),
                                            encoding="utf-8")
        shutil.copyfile(MODEL_FILE, model / "1" / "model.py")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ---- requests ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodedRequest:
    prompt: str
    params: SamplingParams
    stream: bool


def _one(name: str, array: np.ndarray) -> object:
    if array.size != 1:
        raise BadRequest(f"{name}: one value per request, got shape {list(array.shape)}")
    return array.reshape(-1)[0]


def _text(name: str, value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest(f"{name}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
                             ) from None
    raise BadRequest(f"{name}: must be BYTES, got {type(value).__name__}")


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise BadRequest(f"{name}: must be an integer, got {value!r}")
    if int(value) < minimum:
        raise BadRequest(f"{name}: must be >= {minimum}, got {int(value)}")
    return int(value)


def _float(name: str, value: object) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise BadRequest(f"{name}: must be a number, got {value!r}")
    if not math.isfinite(float(value)):
        raise BadRequest(f"{name}: must be finite, got {float(value)}")
    return float(value)


def decode_request(get_input: Callable[[str], np.ndarray | None],
                   served_mode: str) -> DecodedRequest:
    """Turn a request's input tensors into (prompt, SamplingParams, stream).

    get_input(name): the input as a numpy array (BYTES as an object array of bytes), or None
    if the request does not carry it. served_mode: the instance's speculative mode.

    Raises:
        BadRequest: naming the input, for a missing required input, a value out of range, a
            prompt that is not UTF-8, an unknown speculative mode, anything unsupported.
    """
    from ..sampling import SamplingParams

    def value(name: str) -> object | None:
        array = get_input(name)
        return None if array is None else _one(name, np.asarray(array))

    text = value("text_input")
    if text is None:
        raise BadRequest("text_input: required (BYTES, the prompt)")
    prompt = _text("text_input", text)
    max_tokens = value("max_tokens")
    if max_tokens is None:
        raise BadRequest("max_tokens: required (INT32 >= 1)")
    kwargs: dict = {"max_tokens": _int("max_tokens", max_tokens, 1)}
    if (t := value("temperature")) is not None:
        kwargs["temperature"] = _float("temperature", t)
        if kwargs["temperature"] < 0:
            raise BadRequest(f"temperature: must be >= 0, got {kwargs['temperature']}")
    if (p := value("top_p")) is not None:
        kwargs["top_p"] = _float("top_p", p)
        if not 0 < kwargs["top_p"] <= 1:
            raise BadRequest(f"top_p: must be in (0, 1], got {kwargs['top_p']}")
    if (k := value("top_k")) is not None:
        kwargs["top_k"] = _int("top_k", k, 0)
    if (s := value("random_seed")) is not None:
        kwargs["seed"] = _int("random_seed", s, 0)
    if (e := value("end_id")) is not None:   # TensorRT-LLM: end_id replaces the model's EOS
        kwargs["stop_token_ids"], kwargs["ignore_eos"] = (_int("end_id", e, 0),), True
    value("pad_id")                          # accepted for TensorRT-LLM clients; no padding here
    stops = get_input("stop_words")
    if stops is not None:
        kwargs["stop"] = tuple(w for w in (_text("stop_words", v)
                                           for v in np.asarray(stops).reshape(-1)) if w)
    bad = get_input("bad_words")
    if bad is not None and any(_text("bad_words", v) for v in np.asarray(bad).reshape(-1)):
        raise BadRequest("bad_words: not supported (only empty strings are accepted)")
    stream = value("stream")
    if stream is not None and not isinstance(stream, (bool, np.bool_)):
        raise BadRequest(f"stream: must be BOOL, got {stream!r}")
    if (mode := value("speculative")) is not None:
        mode = _text("speculative", mode)
        if mode not in SPECULATIVE_MODES:
            raise BadRequest(f"speculative: unknown mode {mode!r}; one of "
                             f"{list(SPECULATIVE_MODES)}")
        if mode != served_mode:
            raise BadRequest(f"speculative: this model serves {served_mode!r}, not {mode!r} "
                             "(the mode is set when the repository is written)")
    try:
        params = SamplingParams(**kwargs)
    except ValueError as exc:  # anything the checks above let through
        raise BadRequest(str(exc).replace("SamplingParams.", "")) from None
    return DecodedRequest(prompt, params, bool(stream))


def output_tensors(text: str, finish_reason: str | None, spec) -> dict[str, np.ndarray]:
    """The response tensors (batch dimension 1). spec: the request's SpecMetrics."""
    proposed, accepted = sum(spec.proposed.values()), sum(spec.accepted.values())
    tau = spec.acceptance_length
    return {
        "text_output": np.array([[text.encode("utf-8")]], dtype=np.object_),
        "finish_reason": np.array([[(finish_reason or "").encode()]], dtype=np.object_),
        "acceptance_rate": np.array([[accepted / proposed if proposed else 0.0]], np.float32),
        "total_accepted_draft_tokens": np.array([[accepted]], np.int32),
        "total_draft_tokens": np.array([[proposed]], np.int32),
        "acceptance_length": np.array([[tau if tau is not None else 0.0]], np.float32),
    }


def error_kind(exc: BaseException) -> str:
    """The TritonError code name for an exception: INVALID_ARG for a bad request (HTTP 400),
    UNAVAILABLE for a full queue or an unloading model (503), INTERNAL otherwise (500)."""
    from .engine_loop import QueueFull

    if isinstance(exc, (QueueFull, ModelClosing)):
        return "UNAVAILABLE"
    if isinstance(exc, ValueError):
        return "INVALID_ARG"
    return "INTERNAL"


# ---- the front end: requests -> EngineLoop -> responses ------------------------------------
class Sender(Protocol):
    """One request's way back (the model wraps Triton's response sender in this)."""

    def send(self, outputs: dict[str, np.ndarray] | None, error: BaseException | None,
             final: bool) -> None: ...

    def is_cancelled(self) -> bool: ...


class ModelClosing(RuntimeError):
    """The model is being unloaded (server shutting down) before the request finished."""


class TritonFrontEnd:
    """What a model instance does, without Triton: decoded requests go to one EngineLoop
    (one continuous batch for every request of the instance); each step the engine thread
    commits is handed to one sender thread, which sends it as a response (stream: each
    non-empty delta, then a final response; otherwise one final response with all the text).
    A cancelled request (its client went away) is aborted in the engine."""

    def __init__(self, loop, served_mode: str):
        self.loop, self.served_mode = loop, served_mode
        self._ids = itertools.count()
        self._live: dict[str, tuple[Sender, bool]] = {}
        self._lock = threading.Lock()
        self._outbox: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._send_loop, name="kolibri-triton-send",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, options: ModelOptions) -> TritonFrontEnd:
        """Load the engine and start its loop (one engine per model instance)."""
        from ..runtime.engine import EngineArgs, LLMEngine
        from .engine_loop import EngineLoop

        args = EngineArgs(max_num_seqs=options.max_num_seqs, max_model_len=options.max_model_len,
                          kv_cache_memory=options.kv_cache_memory)
        engine = LLMEngine(options.engine_dir, options.speculative, args)
        return cls(EngineLoop(engine, max_waiting=options.max_waiting), options.speculative)

    def submit(self, get_input: Callable[[str], np.ndarray | None], sender: Sender) -> str:
        """Decode and queue one request. Raises BadRequest / ValueError (bad request),
        QueueFull, ModelClosing; the caller sends those as error responses."""
        req = decode_request(get_input, self.served_mode)
        rid = f"triton-{next(self._ids)}"
        with self._lock:
            if self._closed:
                raise ModelClosing("the model is being unloaded")
            self._live[rid] = (sender, req.stream)
        try:
            self.loop.submit(req.prompt, req.params,
                             lambda item: self._outbox.put((rid, item)), request_id=rid)
        except ValueError as exc:
            self._live.pop(rid, None)
            raise BadRequest(f"text_input: {exc}") from None
        except BaseException:
            self._live.pop(rid, None)
            raise
        return rid

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine loop; requests still running get an UNAVAILABLE error response."""
        with self._lock:
            self._closed = True
        self.loop.close(timeout)
        self._outbox.put(None)
        self._thread.join(timeout)
        for rid in list(self._live):
            self._finish(rid, None, ModelClosing("the model was unloaded before the request "
                                                 "finished"))

    def num_live(self) -> int:
        return len(self._live)

    # ---- sender thread ------------------------------------------------------------------------
    def _send_loop(self) -> None:
        while True:
            entry = self._outbox.get()
            if entry is None:
                return
            rid, item = entry
            try:
                self._relay(rid, item)
            except Exception as exc:  # a failed send must not stop the other requests
                self.loop.abort(rid)
                try:
                    self._finish(rid, None, exc)
                except Exception:  # noqa: BLE001 (the request's connection is gone)
                    pass

    def _relay(self, rid: str, item) -> None:
        live = self._live.get(rid)
        if live is None:
            return
        sender, stream = live
        if isinstance(item, BaseException):
            self._finish(rid, None, item)
            return
        out = item.output
        if sender.is_cancelled():
            self.loop.abort(rid)
            self._finish(rid, None, None)
            return
        if out.finished:
            text = item.delta_text if stream else out.text
            self._finish(rid, output_tensors(text, out.finish_reason, out.metrics.spec), None)
        elif stream and item.delta_text:
            sender.send(output_tensors(item.delta_text, None, out.metrics.spec), None, False)

    def _finish(self, rid: str, outputs, error) -> None:
        live = self._live.pop(rid, None)
        if live is not None:
            live[0].send(outputs, error, True)

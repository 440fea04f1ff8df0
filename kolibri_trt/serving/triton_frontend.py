"""The request side of the Triton Inference Server model (`triton_model.py`): decoding a
request's input tensors into a prompt and SamplingParams, the output tensors, and
`TritonFrontEnd`, which feeds one `EngineLoop` per model instance and sends each step as a
response. Tensor names and meanings: `triton_repo.py`. Runs without a Triton server, so it is
unit-tested directly; only `triton_model.py` imports `triton_python_backend_utils`.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from ..spec.speculator import MODES as SPECULATIVE_MODES
from .triton_repo import ModelOptions

if TYPE_CHECKING:
    from ..sampling import SamplingParams


class BadRequest(ValueError):
    """A request the model rejects; the message starts with the input's name."""


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
        if item.finished:
            text = item.delta_text if stream else out.text
            self._finish(rid, output_tensors(text, out.finish_reason, out.metrics.spec), None)
        elif stream and item.delta_text:
            sender.send(output_tensors(item.delta_text, None, out.metrics.spec), None, False)

    def _finish(self, rid: str, outputs, error) -> None:
        live = self._live.pop(rid, None)
        if live is not None:
            live[0].send(outputs, error, True)

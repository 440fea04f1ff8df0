"""OpenAI API shapes for `kolibri-trt serve`: request models (strict: a field of the wrong type
or an unknown field is a 400 that names it), their mapping to `SamplingParams`, and the
response / stream-chunk dictionaries.

Sampling fields follow OpenAI (max_tokens, temperature (default 1.0), top_p, seed, stop, n = 1)
plus vLLM's extras (top_k, ignore_eos, stop_token_ids, return_token_ids). Every response carries
`kolibri_metrics` (timings and the request's speculative-decoding acceptance), an extra field
that OpenAI clients keep as an unknown attribute.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ..runtime.output import RequestMetrics, RequestOutput
from ..sampling import SamplingParams

COMPLETION_DEFAULT_MAX_TOKENS = 16   # OpenAI's default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 256        # capped by the room max_model_len leaves after the prompt


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = (status, message, param,
                                                                      type_, code)

    def body(self) -> dict:
        """The JSON body of the error response."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    """`stream_options`: include_usage adds a last chunk with `usage` and no choices."""

    include_usage: bool = False


class _SamplingRequest(_Strict):
    """Fields shared by completions and chat completions."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None                      # an end-user tag; accepted and not used
    frequency_penalty: float | None = None       # only 0 (no penalty) is supported
    presence_penalty: float | None = None        # only 0 (no penalty) is supported
    top_k: int | None = None                     # vLLM: 0 or -1 = off
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    return_token_ids: bool = False               # vLLM: token ids in choices and chunks


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions. `prompt`: a string, a list of one string, or token ids."""

    prompt: Any

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            value = value[0]
        if isinstance(value, str):
            return value
        if (isinstance(value, list) and value
                and all(isinstance(t, int) and not isinstance(t, bool) for t in value)):
            return value
        raise ValueError("must be a string, a list of one string, or a non-empty list of "
                         "token ids (one prompt per request)")


class ChatMessage(_Strict):
    """One turn: role system | user | assistant, text content."""

    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_SamplingRequest):
    """POST /v1/chat/completions. `max_completion_tokens` is OpenAI's newer name of max_tokens."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


def parse_request(model: type[_Strict], body: bytes) -> Any:
    """Validate a JSON body. Raises ApiError(400) naming the first offending field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def _validation_error(exc: ValidationError) -> ApiError:
    err = exc.errors(include_url=False)[0]
    path = _field_path(err["loc"])
    kind = err["type"]
    if kind == "json_invalid":
        return ApiError(400, f"body: not valid JSON ({err['msg']})", "body")
    if kind == "model_type" and not path:
        return ApiError(400, "body: must be a JSON object", "body")
    if kind == "extra_forbidden":
        return ApiError(400, f"{path}: unknown or unsupported field", path)
    if kind == "missing":
        return ApiError(400, f"{path}: field required", path)
    msg = err["msg"].removeprefix("Value error, ")
    got = f" (got {type(err['input']).__name__})" if kind.endswith("_type") else ""
    return ApiError(400, f"{path}: {msg}{got}", path)


def _field_path(loc: tuple) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'; pydantic's union tags are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier() and part not in ("str", "int", "float", "bool", "list"):
            out += f".{part}" if out else part
    return out


def sampling_params(req: _SamplingRequest, prompt_len: int, max_model_len: int,
                    default_max_tokens: int) -> SamplingParams:
    """The request's SamplingParams. A max_tokens the client set must fit in max_model_len
    with the prompt; the default is capped to the room left.

    Raises:
        ApiError(400) naming the field.
    """
    if req.n is not None and req.n != 1:
        raise ApiError(400, f"n: only n = 1 is supported, got {req.n}", "n")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(req, name) not in (None, 0):
            raise ApiError(400, f"{name}: only 0 is supported", name)
    name, max_tokens = _max_tokens_field(req)
    room = max_model_len - prompt_len
    if max_tokens is None:
        max_tokens = min(default_max_tokens, room)
    elif max_tokens < 1:
        raise ApiError(400, f"{name}: must be >= 1, got {max_tokens}", name)
    elif max_tokens > room:
        raise ApiError(400, f"{name}: {max_tokens} tokens requested after a prompt of "
                       f"{prompt_len} tokens, but max_model_len is {max_model_len} (at most "
                       f"{room} fit)", name)
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k in (None, -1) else req.top_k, seed=req.seed,
            stop=req.stop or (), stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=req.ignore_eos)
    except ValueError as exc:   # "SamplingParams.<field>: <why>, got <value>"
        message = str(exc).removeprefix("SamplingParams.")
        raise ApiError(400, message, message.split(":", 1)[0]) from None


def _max_tokens_field(req: _SamplingRequest) -> tuple[str, int | None]:
    """(the field that set the limit, its value); chat's max_completion_tokens wins."""
    value = getattr(req, "max_completion_tokens", None)
    if value is not None:
        return "max_completion_tokens", value
    return "max_tokens", req.max_tokens


def kolibri_metrics(m: RequestMetrics) -> dict:
    """Per-request timings and speculative-decoding acceptance (the extra response field)."""
    s = m.spec
    return {"num_prompt_tokens": m.num_prompt_tokens,
            "num_generated_tokens": m.num_generated_tokens,
            "time_to_first_token_s": m.time_to_first_token_s, "total_time_s": m.total_time_s,
            "decode_tokens_per_s": m.decode_tokens_per_s, "num_steps": m.num_steps,
            "num_preemptions": m.num_preemptions,
            "spec": {"proposed": dict(s.proposed), "accepted": dict(s.accepted),
                     "target_passes": s.target_passes, "tokens": s.tokens,
                     "acceptance_length": s.acceptance_length,
                     "acceptance_rate_per_position": s.acceptance_rate_per_position}}


def usage(out: RequestOutput) -> dict:
    """OpenAI's usage block: prompt, completion and total tokens."""
    n_prompt, n_out = len(out.prompt_token_ids), len(out.token_ids)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out}


class ResponseBuilder:
    """Builds one request's response or stream chunks (completion or chat shape)."""

    def __init__(self, request_id: str, model: str, chat: bool, return_token_ids: bool):
        self.id, self.model, self.chat = request_id, model, chat
        self.return_token_ids = return_token_ids
        self.created = int(time.time())

    def _envelope(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def response(self, out: RequestOutput) -> dict:
        """The whole (non-streamed) response of a finished request."""
        choice: dict = {"index": 0, "finish_reason": out.finish_reason, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text
        if self.return_token_ids:
            choice["token_ids"] = list(out.token_ids)
        body = self._envelope(chunk=False) | {"choices": [choice], "usage": usage(out),
                                              "kolibri_metrics": kolibri_metrics(out.metrics)}
        if self.return_token_ids:
            body["prompt_token_ids"] = list(out.prompt_token_ids)
        return body

    def role_chunk(self) -> dict:
        """Chat streams open with the assistant role and empty content."""
        choice: dict = {"index": 0, "delta": {"role": "assistant", "content": ""},
                        "logprobs": None, "finish_reason": None}
        if self.return_token_ids:
            choice["token_ids"] = []
        return self._envelope(chunk=True) | {"choices": [choice]}

    def chunk(self, text: str, token_ids: list[int], out: RequestOutput | None) -> dict:
        """A stream chunk with a text delta; `out` (the finished output) on the last one adds
        finish_reason and kolibri_metrics."""
        choice: dict = {"index": 0, "logprobs": None,
                        "finish_reason": out.finish_reason if out is not None else None}
        if self.chat:
            choice["delta"] = {"content": text} if text else {}
        else:
            choice["text"] = text
        if self.return_token_ids:
            choice["token_ids"] = list(token_ids)
        body = self._envelope(chunk=True) | {"choices": [choice]}
        if out is not None:
            body["kolibri_metrics"] = kolibri_metrics(out.metrics)
        return body

    def usage_chunk(self, out: RequestOutput) -> dict:
        """The last chunk when stream_options.include_usage is set: usage, no choices."""
        return self._envelope(chunk=True) | {"choices": [], "usage": usage(out)}

"""`kolibri-trt serve`: an OpenAI-compatible HTTP API (FastAPI + uvicorn) over one `LLMEngine`.

    POST /v1/completions, /v1/chat/completions   (`"stream": true`: server-sent events)
    GET  /v1/models, /health, /metrics           (/metrics: Prometheus text format)

All requests share one `EngineLoop` (continuous batching). The loop's bounded admission queue
answers 503 when full; a client that goes away (mid-stream or while waiting for a whole
response) has its request aborted and its KV blocks freed. With an API key, every /v1 route
needs `Authorization: Bearer KEY` (401 otherwise); /health and /metrics stay open.

    app = build_app(LLMEngine("engines/gb10", "copy"), api_key="secret")   # tests: any ASGI server
    serve("engines/gb10", host="127.0.0.1", port=8000)                      # the CLI
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ..runtime.engine import EngineArgs, LLMEngine, StepOutput
from ..sampling import SamplingParams
from .engine_loop import EngineLoop, QueueFull
from .openai_metrics import ServerMetrics
from .openai_protocol import (
    CHAT_DEFAULT_MAX_TOKENS,
    COMPLETION_DEFAULT_MAX_TOKENS,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    ResponseBuilder,
    parse_request,
    sampling_params,
)

log = logging.getLogger("kolibri_trt.serve")
MAX_BODY_BYTES = 4 << 20
STEP_TIMEOUT_S = 300      # the longest a CPU engine step may take before shutdown gives up


class _State:
    """What the routes of one app share: the engine, its loop (set by the lifespan), metrics."""

    def __init__(self, engine: LLMEngine, model_name: str, api_key: str | None,
                 max_waiting: int):
        self.engine, self.model_name, self.api_key = engine, model_name, api_key
        self.max_waiting = max_waiting
        self.metrics = ServerMetrics(engine)
        self.loop: EngineLoop | None = None
        self.created = int(time.time())

    def start(self) -> None:
        self.loop = EngineLoop(self.engine, self.max_waiting)

    def stop(self) -> None:
        """Stop the engine thread, then drop what the engine still holds (requests whose
        streams could not be aborted through the loop any more)."""
        if self.loop is None:
            return
        loop, self.loop = self.loop, None
        loop.close(timeout=STEP_TIMEOUT_S)
        if loop._thread.is_alive():   # never touch the engine while its thread may step it
            log.warning("shutdown: the engine thread is still in a step after %d s",
                        STEP_TIMEOUT_S)
            return
        left = list(self.engine.requests)
        for rid in left:
            self.engine.abort(rid)
        if left:
            log.warning("shutdown: aborted %d unfinished requests", len(left))


class _Submission:
    """One request in the engine loop, its steps delivered to the calling event loop.
    `close()` aborts it unless it has finished; every path must call it."""

    def __init__(self, state: _State, ids: list[int], params: SamplingParams, rid: str,
                 arrival: float):
        if state.loop is None:
            raise ApiError(503, "the server is not running (starting or shutting down)",
                           type_="server_error", code="not_running")
        aio = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

        def deliver(item: StepOutput | BaseException) -> None:   # on the engine thread
            try:
                aio.call_soon_threadsafe(self.queue.put_nowait, item)
            except RuntimeError:   # the event loop is closed: shutdown aborts what is left
                pass
        try:
            state.loop.submit(ids, params, deliver, rid)
        except QueueFull as exc:
            raise ApiError(503, f"server at capacity ({exc}); retry later",
                           type_="server_overloaded", code="queue_full") from None
        except ValueError as exc:
            raise ApiError(400, str(exc), str(exc).split(":", 1)[0]) from None
        self.loop, self.rid, self.metrics, self.arrival = state.loop, rid, state.metrics, arrival
        self.first_token_at: float | None = None
        self.ended = False
        self.metrics.in_flight.inc()
        self.metrics.prompt_tokens.inc(len(ids))

    async def steps(self) -> AsyncIterator[StepOutput]:
        """The request's steps until it finishes. Raises ApiError(500) if the engine failed."""
        while not self.ended:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                self._end("error")
                raise ApiError(500, f"generation failed: {item}", type_="server_error")
            self._observe(item)
            yield item

    def _observe(self, step: StepOutput) -> None:
        now = time.perf_counter()
        self.metrics.add_tokens(len(step.new_token_ids))
        if self.first_token_at is None and step.new_token_ids:
            self.first_token_at = now
            self.metrics.ttft.observe(now - self.arrival)
        if step.finished:
            self.metrics.latency.observe(now - self.arrival)
            self._end(step.output.finish_reason)

    def _end(self, reason: str) -> None:
        if not self.ended:
            self.ended = True
            self.metrics.in_flight.dec()
            self.metrics.finished.labels(reason).inc()

    def close(self) -> None:
        """Abort the request (frees its KV blocks) unless it already ended."""
        if not self.ended:
            self.loop.abort(self.rid)
            self._end("abort")


class _EventStream(StreamingResponse):
    """Server-sent events that notice a client going away while the request is still waiting
    for tokens (a server may drop sends to a closed socket silently), cancel the stream then,
    and always run `on_close` (which aborts an unfinished request)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:        # the client went away during a send
                        pass
                    tg.cancel_scope.cancel()
                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()
            self.on_close()


def _sse(obj: dict | str) -> str:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False,
                                                        separators=(",", ":"))
    return f"data: {data}\n\n"


async def _events(sub: _Submission, builder: ResponseBuilder, include_usage: bool
                  ) -> AsyncIterator[str]:
    """The SSE chunks of one request: (chat: the role), text deltas, the finish chunk with
    finish_reason and kolibri_metrics, (usage), then [DONE]. An engine failure is sent as an
    error event."""
    if builder.chat:
        yield _sse(builder.role_chunk())
    try:
        async for step in sub.steps():
            out = step.output if step.finished else None
            ids = step.new_token_ids if builder.return_token_ids else []
            if step.delta_text or ids or out is not None:
                yield _sse(builder.chunk(step.delta_text, ids, out))
            if out is not None and include_usage:
                yield _sse(builder.usage_chunk(out))
    except ApiError as exc:
        yield _sse(exc.body())
    yield _sse("[DONE]")


async def _until_disconnected(request: Request) -> None:
    """Return when the client has gone away (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _whole_response(request: Request, sub: _Submission, builder: ResponseBuilder
                          ) -> Response:
    """Wait for the finished request, or abort it if the client goes away first."""
    async def collect():
        last = None
        async for step in sub.steps():
            last = step
        return last.output

    done = asyncio.ensure_future(collect())
    gone = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        if done.done():
            return JSONResponse(builder.response(done.result()))
        return Response(status_code=499)   # nobody is listening; nginx's "client closed"
    finally:
        done.cancel()
        gone.cancel()
        sub.close()


async def _read_body(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, f"body: larger than {MAX_BODY_BYTES} bytes", "body")
        chunks.append(chunk)
    return b"".join(chunks)


def _prompt_ids(engine: LLMEngine, req, chat: bool) -> list[int]:
    """The request's prompt as checked token ids. Raises ApiError(400) naming the field."""
    field = "messages" if chat else "prompt"
    try:
        prompt = (engine.tokenizer.apply_chat_template([m.model_dump() for m in req.messages])
                  if chat else req.prompt)
        return engine.check_request(prompt)
    except ValueError as exc:       # "prompt: ..." from the engine, "messages[i].x: ..."
        message = str(exc)
        if message.startswith("prompt:"):
            message = field + message.removeprefix("prompt")
        raise ApiError(400, message, message.split(":", 1)[0]) from None


async def _generate(request: Request, state: _State, chat: bool) -> Response:
    arrival = time.perf_counter()
    req = parse_request(ChatCompletionRequest if chat else CompletionRequest,
                        await _read_body(request))
    if req.model != state.model_name:
        raise ApiError(404, f"model: {req.model!r} is not served here; the model is "
                       f"{state.model_name!r}", "model", code="model_not_found")
    ids = _prompt_ids(state.engine, req, chat)
    default = CHAT_DEFAULT_MAX_TOKENS if chat else COMPLETION_DEFAULT_MAX_TOKENS
    params = sampling_params(req, len(ids), state.engine.args.max_model_len, default)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    builder = ResponseBuilder(rid, state.model_name, chat, req.return_token_ids)
    sub = _Submission(state, ids, params, rid, arrival)
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        return _EventStream(_events(sub, builder, include_usage), sub.close)
    return await _whole_response(request, sub, builder)


def _v1_router(state: _State) -> APIRouter:
    def authorize(request: Request) -> None:
        if state.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
                token.strip().encode(), state.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                           type_="authentication_error", code="invalid_api_key")

    router = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    @router.get("/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "kolibri-trt", "max_model_len": state.engine.args.max_model_len}]}

    @router.post("/completions")
    async def completions(request: Request) -> Response:
        return await _generate(request, state, chat=False)

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(request, state, chat=True)

    return router


def build_app(engine: LLMEngine, *, model_name: str = "kolibri-1", api_key: str | None = None,
              max_waiting: int = 128) -> FastAPI:
    """The FastAPI app over an existing engine. Its lifespan starts one EngineLoop (so the
    engine must not be stepped by anyone else while the app runs) and closes it at shutdown.

    Args:
        model_name: the `model` every request must name (404 otherwise).
        api_key: when set, /v1 routes need `Authorization: Bearer <api_key>`.
        max_waiting: requests not yet admitted to the batch before new ones get 503.
    """
    if api_key is not None and not api_key:
        raise ValueError("api_key: must be a non-empty string or None")
    if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 1:
        raise ValueError(f"max_waiting: must be an int >= 1, got {max_waiting!r}")
    state = _State(engine, model_name, api_key, max_waiting)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.start()
        try:
            yield
        finally:
            state.stop()

    app = FastAPI(title="kolibri-trt", lifespan=lifespan)
    app.state.kolibri = state
    _add_service_routes(app, state)
    app.include_router(_v1_router(state))
    return app


def _add_service_routes(app: FastAPI, state: _State) -> None:
    """The OpenAI-shaped error handler, /health and /metrics (no API key needed)."""
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        state.metrics.errors.labels(str(exc.status)).inc()
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else (
            {"Retry-After": "1"} if exc.status == 503 else None)
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.get("/health")
    async def health() -> JSONResponse:
        # EngineLoop has no public liveness probe; its thread is the engine.
        alive = state.loop is not None and state.loop._thread.is_alive()
        return JSONResponse({"status": "ok" if alive else "engine not running"},
                            status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def serve(engine_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000,
          api_key: str | None = None, speculative: str = "copy+drafter",
          engine_args: EngineArgs | None = None, max_waiting: int = 128,
          model_name: str | None = None, log_level: str = "info") -> None:
    """Load the engine and serve it until SIGINT / SIGTERM (graceful: open requests get 10 s).

    Raises:
        ValueError / FileNotFoundError: a bad option or engine folder (before binding).
    """
    import uvicorn

    engine = LLMEngine(engine_dir, speculative, engine_args)
    name = model_name or Path(engine_dir).resolve().name
    app = build_app(engine, model_name=name, api_key=api_key, max_waiting=max_waiting)
    limit = max_waiting + engine.args.max_num_seqs + 64   # connections beyond: plain 503
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=10, limit_concurrency=limit)
    print(f"kolibri-trt serve: model {name!r} (speculative={speculative}, max_num_seqs="
          f"{engine.args.max_num_seqs}, max_model_len={engine.args.max_model_len}) on "
          f"http://{host}:{port}{' (API key required)' if api_key else ''}", file=sys.stderr,
          flush=True)
    uvicorn.Server(config).run()

"""`EngineLoop`: one thread steps one `LLMEngine`; any number of front-end threads or event
loops submit requests and receive their tokens as they are committed.

Every serving front end (the OpenAI-compatible server, the Triton Inference Server model) uses
this: concurrent requests join the same continuous batch instead of being served one by one.
Callbacks run on the engine thread and must be quick (put into a queue, hand to an event loop).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterator

from ..runtime.engine import LLMEngine, StepOutput
from ..sampling import SamplingParams

Callback = Callable[["StepOutput | BaseException"], None]


class QueueFull(RuntimeError):
    """More requests are waiting than `max_waiting`; the caller should answer 429/503."""


@dataclass
class _Submit:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    callback: Callback


class EngineLoop:
    """Owns the engine thread. `max_waiting` bounds requests not yet admitted to the batch.

    Raises (from `submit`): QueueFull when the bound is reached; ValueError for a bad request
    (checked on the caller's thread, before it is queued).
    """

    def __init__(self, engine: LLMEngine, max_waiting: int = 256):
        self.engine, self.max_waiting = engine, max_waiting
        self._inbox: queue.Queue = queue.Queue()
        self._callbacks: dict[str, Callback] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="kolibri-engine", daemon=True)
        self._thread.start()

    # ---- front-end side ----------------------------------------------------------------
    def submit(self, prompt: str | list[int], params: SamplingParams, callback: Callback,
               request_id: str | None = None) -> str:
        """Queue a request; `callback` gets each StepOutput, or an exception if the request
        failed inside the engine. Returns the request id."""
        self.engine.check_request(prompt)
        with self._lock:
            if self._pending + len(self.engine.scheduler.waiting) >= self.max_waiting:
                raise QueueFull(f"{self.max_waiting} requests are already waiting")
            self._pending += 1
        rid = request_id or f"srv-{next(self._ids)}"
        self._inbox.put(_Submit(rid, prompt, params, callback))
        self._wake.set()
        return rid

    def abort(self, request_id: str) -> None:
        """Cancel a request (e.g. its client went away) and free its KV blocks."""
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def stream(self, prompt: str | list[int], params: SamplingParams) -> Iterator[StepOutput]:
        """Blocking iterator over one request's steps (for threads)."""
        q: queue.Queue = queue.Queue()
        self.submit(prompt, params, q.put)
        while True:
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return

    async def astream(self, prompt: str | list[int], params: SamplingParams,
                      request_id: str | None = None) -> AsyncIterator[StepOutput]:
        """Async iterator over one request's steps; cancelling the consumer aborts it."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        rid = self.submit(prompt, params, lambda item: loop.call_soon_threadsafe(q.put_nowait, item),
                          request_id)
        done = False
        try:
            while not done:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                done = item.finished
                yield item
        finally:
            if not done:
                self.abort(rid)

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    # ---- engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox()
            if not self.engine.has_unfinished():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                steps = self.engine.step()
            except Exception as exc:  # a failed step fails its requests, never the server
                self._fail_all(exc)
                continue
            for step in steps:
                cb = self._callbacks.get(step.request_id)
                if step.finished:
                    self._callbacks.pop(step.request_id, None)
                if cb is not None:
                    self._deliver(step.request_id, cb, step)

    def _deliver(self, request_id: str, cb: Callback, item) -> None:
        """Run a front end's callback; if it fails (e.g. its event loop is gone), the request
        is aborted: a broken consumer never stops the engine thread."""
        try:
            cb(item)
        except Exception:
            self.engine.abort(request_id)
            self._callbacks.pop(request_id, None)

    def _drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                self.engine.abort(item[1])
                self._callbacks.pop(item[1], None)
                continue
            with self._lock:
                self._pending -= 1
            try:
                self.engine.add_request(item.prompt, item.params, item.request_id)
                self._callbacks[item.request_id] = item.callback
            except Exception as exc:
                self._deliver(item.request_id, item.callback, exc)

    def _fail_all(self, exc: Exception) -> None:
        for rid, cb in list(self._callbacks.items()):
            self.engine.abort(rid)
            self._deliver(rid, cb, RuntimeError(f"engine step failed: {exc}"))
        self._callbacks.clear()

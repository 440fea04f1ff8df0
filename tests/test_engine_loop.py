"""EngineLoop: concurrent submitters share one continuous batch; abort frees blocks."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.serving import EngineLoop, QueueFull

from runtime_engines import small_target, write_engine
from test_runtime import PROMPTS


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(write_engine(tmp_path_factory.mktemp("loop"), small_target()), speculative="copy")


def test_threads_and_asyncio_get_offline_tokens(llm):
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=2, ignore_eos=True)
    offline = [o.token_ids for o in llm.generate(PROMPTS, params)]
    loop = EngineLoop(llm.engine)
    try:
        got: dict[int, list[int]] = {}

        def worker(i):
            got[i] = [t for step in loop.stream(PROMPTS[i], params) for t in step.new_token_ids]
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()

        async def consume(i):
            return [t async for step in loop.astream(PROMPTS[i], params) for t in step.new_token_ids]

        async def main():
            return await asyncio.gather(*(consume(i) for i in range(4, 8)))
        got.update(dict(zip(range(4, 8), asyncio.run(main()))))
        for t in threads:
            t.join()
        assert [got[i] for i in range(8)] == offline
    finally:
        loop.close()


def test_a_consumer_behind_the_engine_gets_every_step(llm):
    """The engine thread may finish a request before its consumer reads the first step: every
    queued step keeps its own `finished`, so none is dropped (a server once ended such a
    stream at its first step, whose shared RequestOutput already read finished)."""
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=5, ignore_eos=True)
    offline = llm.generate(PROMPTS[:1], params)[0].token_ids
    loop = EngineLoop(llm.engine)
    try:
        items: list = []
        done = threading.Event()

        def slow_consumer(item):   # on the engine thread: keep everything, read it later
            items.append(item)
            if item.finished:
                done.set()
        loop.submit(PROMPTS[0], params, slow_consumer)
        assert done.wait(120)
        assert len(items) > 1 and items[0].output.finished and not items[0].finished
        got = []
        for item in items:
            got += item.new_token_ids
            if item.finished:
                break
        assert got == offline
    finally:
        loop.close()


def test_abandoned_async_stream_is_aborted_and_frees_blocks(llm):
    loop = EngineLoop(llm.engine)
    try:
        async def take_two():
            n, stream = 0, loop.astream(PROMPTS[4], SamplingParams(max_tokens=200, ignore_eos=True))
            async for _ in stream:
                n += 1
                if n == 2:
                    break
            await stream.aclose()          # what a server does when its client goes away
            return n
        assert asyncio.run(take_two()) == 2
        for _ in range(600):     # the engine thread handles the abort after its current step
            if llm.engine.usage()["kv_blocks_used"] == 0 and not llm.engine.has_unfinished():
                break
            threading.Event().wait(0.05)
        assert llm.engine.usage()["kv_blocks_used"] == 0
    finally:
        loop.close()


def test_bad_requests_and_a_full_queue(llm):
    loop = EngineLoop(llm.engine, max_waiting=0)
    try:
        with pytest.raises(QueueFull):
            loop.submit("hi", SamplingParams(), lambda item: None)
        with pytest.raises(ValueError, match="prompt"):
            loop.submit([], SamplingParams(), lambda item: None)
    finally:
        loop.close()


def test_a_failing_consumer_never_stops_the_engine_thread(llm):
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    expected = llm.generate(PROMPTS[1], params)[0].token_ids   # before the loop owns the engine
    loop = EngineLoop(llm.engine)
    try:
        def broken(item):
            raise RuntimeError("consumer gone")
        loop.submit(PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True), broken)
        steps = list(loop.stream(PROMPTS[1], params))
        assert steps[-1].output.finished and loop._thread.is_alive()
        assert steps[-1].output.token_ids == expected
    finally:
        loop.close()

"""Runtime: parity with the reference loop, batching, preemption, streaming, stop rules."""

from __future__ import annotations

import pytest

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.reference_generate import reference_generate

from runtime_engines import reference_of, small_target, write_engine

PROMPTS = [
    "Grüß Gott! Wie geht es dir heute?",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Translate German to English: Die Straße ist nass, weil es regnet.",
    "Hi",
    "Summarize: " + "The council met on Tuesday to discuss the new budget for schools. " * 6,
    "Ä",
    "Who wrote Faust? Answer in one word.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24",
]


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    return write_engine(tmp_path_factory.mktemp("engine"), small_target())


@pytest.fixture(scope="module")
def llm(engine_dir):
    return LLM(engine_dir, speculative="off", max_num_batched_tokens=48)


@pytest.fixture(scope="module")
def reference(engine_dir):
    return reference_of(engine_dir)


GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)
SAMPLED = [SamplingParams(max_tokens=20, temperature=0.9, top_p=0.95, seed=s, ignore_eos=True)
           for s in (1, 2)]


@pytest.mark.parametrize("params", [GREEDY, *SAMPLED], ids=["greedy", "seed1", "seed2"])
def test_batch_of_8_equals_reference_loop_and_single_runs(llm, reference, params):
    batch = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, batch):
        ref = reference_generate(reference, out.prompt_token_ids, params)
        assert out.token_ids == ref.token_ids, prompt
        assert out.finish_reason == "length" and len(out.token_ids) == 20
    alone = llm.generate(PROMPTS[4], params)[0]
    assert alone.token_ids == batch[4].token_ids


def test_same_tokens_after_preemption(engine_dir, llm):
    # A cache with room for few blocks forces newer streams out and back in again.
    small = LLM(engine_dir, speculative="off", max_num_seqs=8, max_model_len=256,
                kv_cache_memory=_bytes_for_full_blocks(engine_dir, 18), max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=30, temperature=0.7, seed=3, ignore_eos=True)
    outs = small.generate(PROMPTS, params)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in llm.generate(PROMPTS, params)]
    assert small.engine.scheduler.blocks.num_used_full == 0


def _bytes_for_full_blocks(engine_dir, n_full_blocks):
    from kolibri_trt.runtime.engine import EngineArgs, plan_cache
    from kolibri_trt.runtime.engine_loader import Manifest
    from kolibri_trt.config import KolibriConfig
    cfg = KolibriConfig.from_json(engine_dir / "target")
    plan = Manifest.read(engine_dir).kv
    base = EngineArgs(max_num_seqs=8, max_model_len=256, kv_cache_memory=1 << 40,
                      max_num_batched_tokens=64)
    g = plan_cache(cfg, plan, base, 64)
    per_full = (base.kv_cache_memory - _sliding_bytes(cfg, plan, g)) // g.num_full_blocks
    return _sliding_bytes(cfg, plan, g) + n_full_blocks * per_full


def _sliding_bytes(cfg, plan, g):
    from kolibri_trt.runtime.kv_cache import bytes_per_token
    n_sliding = sum(cfg.is_sliding(i) for i in range(cfg.num_hidden_layers))
    return g.num_sliding_blocks * g.block_size * bytes_per_token(cfg, plan.sliding) * n_sliding


def test_stream_concatenation_equals_text(llm):
    for prompt in (PROMPTS[0], PROMPTS[5]):
        params = SamplingParams(max_tokens=25, temperature=1.0, seed=7, ignore_eos=True)
        full = llm.generate(prompt, params)[0]
        assert "".join(llm.stream(prompt, params)) == full.text


def test_stop_token_ids_eos_and_max_tokens(llm):
    base = llm.generate(PROMPTS[1], GREEDY)[0]
    stop_id = base.token_ids[5]
    first = base.token_ids.index(stop_id)
    out = llm.generate(PROMPTS[1], SamplingParams(max_tokens=20, stop_token_ids=[stop_id],
                                                  ignore_eos=True))[0]
    assert out.token_ids == base.token_ids[:first + 1] and out.finish_reason == "stop"
    short = llm.generate(PROMPTS[1], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert short.token_ids == base.token_ids[:3] and short.finish_reason == "length"


def test_stop_strings_end_at_the_earliest_in_the_text(llm):
    base = llm.generate(PROMPTS[0], GREEDY)[0]
    text = base.text
    assert len(text) > 12
    early, late = text[3:6], text[9:12]
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=20, stop=[late, early],
                                                  ignore_eos=True))[0]
    cut = min(text.find(early), text.find(late))
    assert out.text == text[:cut] and out.finish_reason == "stop"
    assert len(out.token_ids) < len(base.token_ids)
    streamed = "".join(llm.stream(PROMPTS[0], SamplingParams(max_tokens=20, stop=[late, early],
                                                             ignore_eos=True)))
    assert streamed == out.text


def test_chat_and_invalid_requests(llm):
    out = llm.chat([{"role": "user", "content": "Hallo!"}], SamplingParams(max_tokens=4))[0]
    assert out.prompt_token_ids[0] == llm.tokenizer.bos_token_id and len(out.token_ids) <= 4
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[5] * 5000], GREEDY)
    with pytest.raises(ValueError, match="speculative"):
        LLM(llm.engine.manifest.path.parent, speculative="medusa")
    with pytest.raises(ValueError, match="block_size"):
        LLM(llm.engine.manifest.path.parent, speculative="off", block_size=20)

"""The kernel path (`PluginModel` + `PluginRunner`) on CPU, where every op runs its torch
reference: agreement with the dequantizing reference path on the same engine, CUDA-graph
bucket padding, and what it refuses. The same code on the H200: bench/gpu_runtime.py.
"""

from __future__ import annotations

import pytest
import torch

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.model.metadata import StepMetadata
from kolibri_trt.runtime.batch import build_metadata
from kolibri_trt.runtime.cuda_graphs import PluginRunner
from kolibri_trt.runtime.scheduler import ScheduledSeq

from runtime_engines import small_target, write_engine
from test_runtime import PROMPTS

# Both paths compute the same quantized model; they differ in where rounding happens
# (reference: weights dequantized to fp32, fp32 activations into the INT4 fold; kernels: bf16
# activations into FP8/NVFP4 GEMVs, bf16 rotated query). Measured 2026-11-30 on these engines:
# INT4 KV top-1 0.947, KL 0.00043; FP8 KV top-1 0.955, KL 0.00026 (random weights: flat
# distributions whose top two logits are close). Limits set with headroom.
PATH_MAX_KL = 0.002
PATH_MIN_TOP1 = 0.9
PAD_ATOL = 2e-2   # CPU torch GEMMs pick kernels by row count: padded rows shift bf16 rounding


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins")
    model = small_target()
    return {kv: write_engine(root, model, weights="fp8-nvfp4", kv_cache=kv)
            for kv in ("hadamard-int4", "fp8")}


def _scores(engine, impl, seqs):
    llm = LLM(engine, speculative="off", model_impl=impl)
    return [llm.engine.score(s) for s in seqs]


@pytest.mark.parametrize("kv", ["hadamard-int4", "fp8"])
def test_kernel_path_agrees_with_reference_path(engines, kv):
    base = LLM(engines[kv], speculative="off")
    seqs = []
    for prompt in PROMPTS[:3]:
        out = base.generate(prompt, SamplingParams(max_tokens=16, ignore_eos=True))[0]
        seqs.append(out.prompt_token_ids + out.token_ids)
    ref = torch.cat([base.engine.score(s) for s in seqs])
    got = torch.cat(_scores(engines[kv], "plugins", seqs))
    top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    kl = (ref.softmax(-1) * (ref.log_softmax(-1) - got.log_softmax(-1))).sum(-1).mean().item()
    print(f"{kv}: kernel path vs reference path top-1 {top1:.4f}, KL {kl:.5f}")
    assert kl < PATH_MAX_KL and top1 > PATH_MIN_TOP1


def test_padded_bucket_step_equals_unpadded_step(engines):
    """A decode + verification step padded to its bucket gives the real rows' logits of the
    same step run unpadded (streams of 1 and 4 tokens, 3 streams -> bucket (4, 8))."""
    llm = LLM(engines["hadamard-int4"], speculative="off", model_impl="plugins")
    eng = llm.engine
    ids = [eng.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in PROMPTS[:3]]
    while any(s.num_pending != 1 for s in eng.scheduler.running) or len(eng.scheduler.running) < 3:
        eng.step()
    seqs = list(eng.scheduler.running)
    for s in seqs:
        eng.scheduler.blocks.grow(s, s.num_computed + 4)
    items = [ScheduledSeq(s, s.num_computed, 1) for s in seqs]
    drafts = {seqs[1].request_id: [5, 6, 7]}
    g = eng.cache.geometry
    meta = build_metadata(items, g.block_size, g.ring_blocks, drafts)
    runner: PluginRunner = eng.runner
    assert runner.bucket(meta) == (4, 8)
    padded, _ = runner.forward(meta)
    plain, _ = runner.model.forward(meta, runner.caches, max(meta.seq_lens_host),
                                   max(meta.q_lens))
    assert padded.shape == plain.shape == (6, eng.config.vocab_size)
    assert torch.equal(padded.argmax(-1), plain.argmax(-1))
    torch.testing.assert_close(padded, plain, atol=PAD_ATOL, rtol=0)
    for rid in ids:
        eng.abort(rid)


def _running_streams(eng, n: int, max_tokens: int = 8):
    """Add PROMPTS[:n] and step until all n streams decode one token per step."""
    for p in PROMPTS[:n]:
        eng.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while any(s.num_pending != 1 for s in eng.scheduler.running) or len(eng.scheduler.running) < n:
        eng.step()
    return list(eng.scheduler.running)


def test_taps_sink_gets_the_taps_a_step_returns(engines):
    """use_taps_sink: a bucketed step (3 streams of 1, 4, 1 tokens) and an eager one (a
    16-token chunk, past max_q_len) write into the sink's rows taps_dst[i] exactly the taps
    rows they return without a sink (bit for bit), nothing where taps_dst is -1, and padding
    only into the spare rows; taps_dst without a sink, or of the wrong length, raises."""
    llm = LLM(engines["fp8"], speculative="off", model_impl="plugins")
    eng, taps = llm.engine, (0, 1)
    runner: PluginRunner = eng.runner
    seqs = _running_streams(eng, 3)
    for s in seqs:
        eng.scheduler.blocks.grow(s, s.num_computed + 16)
    g = eng.cache.geometry
    steps = [build_metadata([ScheduledSeq(s, s.num_computed, 1) for s in seqs], g.block_size,
                            g.ring_blocks, {seqs[1].request_id: [5, 6, 7]}),
             build_metadata([ScheduledSeq(seqs[0], 0, 16)], g.block_size, g.ring_blocks)]
    assert runner.bucket(steps[0]) is not None and runner.bucket(steps[1]) is None
    want = [runner.forward(m, taps)[1] for m in steps]
    with pytest.raises(ValueError, match="^taps_dst"):
        runner.forward(steps[0], taps, taps_dst=[0] * 6)          # no sink yet
    spare = 40
    sink = torch.full((spare + runner.max_t, 2, eng.config.hidden_size), 7.0,
                      dtype=torch.bfloat16)
    runner.use_taps_sink(sink, spare)
    with pytest.raises(ValueError, match="^taps_dst"):
        runner.forward(steps[0], taps, taps_dst=[0] * 5)          # 6 tokens
    for meta, w in zip(steps, want):
        t = meta.num_tokens
        dst = [-1 if i % 3 == 2 else 2 * i for i in range(t)]
        sink[:spare] = 7.0
        logits, none = runner.forward(meta, taps, taps_dst=dst)
        assert none is None and logits.shape[0] == int(meta.logits_rows.shape[0])
        for i, d in enumerate(dst):
            if d >= 0:
                assert torch.equal(sink[d], w[i])
        kept = {d for d in dst if d >= 0}
        assert all((sink[r] == 7.0).all() for r in range(spare) if r not in kept)
    for rid in list(eng.requests):
        eng.abort(rid)


def test_fill_gives_every_row_an_owner_and_writes_nothing_for_padding(engines):
    llm = LLM(engines["fp8"], speculative="off", model_impl="plugins", max_num_seqs=8)
    runner: PluginRunner = llm.engine.runner
    q = runner.max_q_len
    meta = StepMetadata(
        input_ids=torch.tensor([3, 4, 5, 6, 7]), positions=torch.tensor([9, 2, 3, 4, 5]),
        cu_q_lens=torch.tensor([0, 1, 5], dtype=torch.int32),
        seq_lens=torch.tensor([10, 6], dtype=torch.int32),
        full_block_tables=torch.tensor([[1], [2]], dtype=torch.int32),
        sliding_block_tables=torch.tensor([[3], [4]], dtype=torch.int32),
        full_slots=torch.tensor([25, 34, 35, 36, 37]), sliding_slots=torch.tensor([57, 66, 67, 68, 69]),
        logits_rows=torch.arange(5), q_lens=(1, 4), seq_lens_host=(10, 6))
    s_b, t_b = runner.bucket(meta)
    assert (s_b, t_b) == (2, 8)
    p = runner._fill(meta, s_b, t_b)
    lens = torch.diff(p.cu_q_lens)
    assert int(p.cu_q_lens[-1]) == t_b and (lens <= q).all()
    assert torch.equal(p.seq_lens[2:], lens[2:])            # padding streams: positions 0..n-1
    assert (p.full_slots[5:] == -1).all() and (p.sliding_slots[5:] == -1).all()
    assert torch.equal(p.full_slots[:5], meta.full_slots)
    assert (p.full_block_tables[2:] == 0).all()


def test_all_padding_step_runs_and_writes_nothing(engines):
    """What `capture_all` runs for each bucket: a step of padding streams only."""
    llm = LLM(engines["hadamard-int4"], speculative="off", model_impl="plugins")
    runner: PluginRunner = llm.engine.runner
    llm.generate(PROMPTS[0], SamplingParams(max_tokens=4))        # some real K/V in the cache
    none = torch.zeros(0, dtype=torch.long)
    empty = StepMetadata(none, none, torch.zeros(1, dtype=torch.int32),
                         torch.zeros(0, dtype=torch.int32), torch.zeros(0, 0, dtype=torch.int32),
                         torch.zeros(0, 0, dtype=torch.int32), none, none, none, (), ())
    before = [{k: v.clone() for k, v in c.items()} for c in runner.caches]
    logits, _ = runner._run(runner._fill(empty, 2, 8), ())
    assert logits.shape[0] == 8 and torch.isfinite(logits).all()
    for b, c in zip(before, runner.caches):
        for k in b:
            assert torch.equal(b[k].reshape(-1).view(torch.uint8), c[k].reshape(-1).view(torch.uint8))
    with pytest.raises(ValueError, match="use_graphs"):
        runner.capture_all()


def test_kernel_path_refuses_bf16_weights(tmp_path):
    engine = write_engine(tmp_path, small_target(), weights="bf16", kv_cache="hadamard-int4")
    with pytest.raises(ValueError, match="weights.target.attention"):
        LLM(engine, speculative="off", model_impl="plugins")


def test_unknown_options_raise(engines):
    with pytest.raises(ValueError, match="model_impl"):
        LLM(engines["fp8"], speculative="off", model_impl="tensorrt")
    with pytest.raises(ValueError, match="device"):
        LLM(engines["fp8"], speculative="off", device="tpu")
    runner = LLM(engines["fp8"], speculative="off", model_impl="plugins").engine.runner
    with pytest.raises(ValueError, match="use_graphs"):
        PluginRunner(runner.model, runner.caches, 1, 64, 2, 16, use_graphs=True)


def test_wgmma_kernels_give_the_mma_tokens_on_cpu(tmp_path):
    """lm_head_kernel and attention_linear_kernel "wgmma" permute the NVFP4 head and the FP8
    QKV / o_proj weights once at load; on CPU their references are nvfp4_gemv's and fp8_gemv's
    on the original bytes, so greedy tokens are the same (on the H200 the kernels' bits differ:
    bench/gpu_check.py nvfp4wg / fp8wg, bench/gpu_runtime.py)."""
    engine = write_engine(tmp_path, small_target(hidden_size=256), weights="fp8-nvfp4",
                          kv_cache="hadamard-int4")
    params = SamplingParams(max_tokens=6, temperature=0.0)
    outs = {}
    for kernel in ("mma", "wgmma"):
        llm = LLM(engine, speculative="off", model_impl="plugins", lm_head_kernel=kernel,
                  attention_linear_kernel=kernel)
        model = llm.engine.runner.model
        assert model.head.kernel == kernel and model.linear_kernel == kernel
        outs[kernel] = [o.token_ids for o in llm.generate(PROMPTS[:2], params)]
    assert outs["mma"] == outs["wgmma"]


def test_auto_head_kernel_takes_wgmma_only_where_it_runs(engines, monkeypatch):
    """lm_head_kernel "auto" (the default): "mma" on CPU, for an FP8 head and for H % 256 !=
    0; "wgmma" for an NVFP4 head on an sm_90 GPU (the capability stubbed: no GPU here); an
    engine on CPU loads with the mma head."""
    from kolibri_trt.model import plugin_model as pm
    cuda = torch.device("cuda", 0)
    assert pm.auto_head_kernel("nvfp4", (1024, 1280), torch.device("cpu")) == "mma"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    pytest.importorskip("triton.experimental.gluon")
    assert pm.auto_head_kernel("nvfp4", (1024, 1280), cuda) == "wgmma"
    assert pm.auto_head_kernel("fp8", (1024, 2560), cuda) == "mma"
    assert pm.auto_head_kernel("nvfp4", (1024, 32), cuda) == "mma"          # H = 64
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 1))
    assert pm.auto_head_kernel("nvfp4", (1024, 1280), cuda) == "mma"        # GB10
    monkeypatch.undo()
    llm = LLM(engines["fp8"], speculative="off", model_impl="plugins")
    assert llm.engine.args.lm_head_kernel == "auto"
    assert llm.engine.runner.model.head.kernel == "mma"


def test_wgmma_kernels_refuse_what_they_cannot_run(engines):
    with pytest.raises(ValueError, match="lm_head_kernel.*K % 128"):   # hidden 64 = 32 bytes
        LLM(engines["fp8"], speculative="off", model_impl="plugins", lm_head_kernel="wgmma")
    with pytest.raises(ValueError, match="lm_head_kernel"):
        LLM(engines["fp8"], speculative="off", model_impl="reference", lm_head_kernel="wgmma")
    with pytest.raises(ValueError, match="lm_head_kernel"):
        LLM(engines["fp8"], speculative="off", lm_head_kernel="tma")
    with pytest.raises(ValueError, match="attention_linear_kernel.*K % 128"):   # QKV K = 64
        LLM(engines["fp8"], speculative="off", model_impl="plugins",
            attention_linear_kernel="wgmma")
    with pytest.raises(ValueError, match="attention_linear_kernel"):
        LLM(engines["fp8"], speculative="off", model_impl="reference",
            attention_linear_kernel="wgmma")


def test_one_rank_fuses_the_o_proj_norm(engines, monkeypatch):
    """At one rank every layer's o_proj and post-attention norm go through the fused op
    (fp8_gemv_add_rms_norm); with an all-reduce hook (here the identity: tensor parallelism's
    path at one rank) they run as fp8_gemv, all-reduce, add_rms_norm, with the same logits."""
    from kolibri_trt.model import plugin_model as pm
    llm = LLM(engines["fp8"], speculative="off", model_impl="plugins")
    model = llm.engine.runner.model
    assert isinstance(llm.engine.runner, PluginRunner) and model.all_reduce is None
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    seq = out.prompt_token_ids + out.token_ids
    calls = []
    fused = pm.fp8_gemv_add_rms_norm
    monkeypatch.setattr(pm, "fp8_gemv_add_rms_norm", lambda *a: calls.append(1) or fused(*a))
    want = llm.engine.score(seq)
    assert len(calls) >= len(model.layers) and len(calls) % len(model.layers) == 0
    calls.clear()
    reduced = []
    monkeypatch.setattr(model, "all_reduce", lambda t: reduced.append(1) or t)
    got = llm.engine.score(seq)
    assert not calls and len(reduced) >= 2 * len(model.layers)
    assert torch.equal(got, want)


def test_each_layer_hands_the_next_qkv_to_the_moe(engines, monkeypatch):
    """Layer i's MoE gets layer i + 1's QKV weight as prefetch_next (the last layer None),
    the tensor the next layer's QKV GEMV reads."""
    from kolibri_trt.model import plugin_model as pm
    llm = LLM(engines["fp8"], speculative="off", model_impl="plugins")
    model = llm.engine.runner.model
    seen = []
    moe = pm.moe_forward
    monkeypatch.setattr(pm, "moe_forward",
                        lambda *a, **k: seen.append(k.get("prefetch_next")) or moe(*a, **k))
    llm.engine.score(llm.generate(PROMPTS[0], SamplingParams(max_tokens=2))[0].prompt_token_ids)
    n = len(model.layers)
    assert seen and len(seen) % n == 0
    want = [w.qkv for w in model.layers[1:]] + [None]
    for step in range(len(seen) // n):
        got = seen[step * n:(step + 1) * n]
        assert all(a is b for a, b in zip(got, want))

"""vocab_argmax: the drafter heads' greedy pick, argmax + draft-vocabulary lookup in one kernel."""

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.vocab_argmax import vocab_argmax, vocab_argmax_ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("N,V,block", [(1, 1, 64), (3, 257, 64), (5, 1000, 256), (2, 33, 4096)])
def test_interpreter_equals_torch(interp, dtype, N, V, block):
    """Exact: ties (coarse bf16 values repeat), NaN and all -inf rows as torch.argmax, into a
    strided output column."""
    import importlib
    mod = importlib.import_module("kolibri_trt_plugins.vocab_argmax")
    g = T.gen(N * V)
    logits = (torch.randint(-4, 4, (N, V), generator=g).float() / 2).to(dtype)  # many ties
    if N >= 3:
        logits[1] = float("-inf")
        logits[2, V // 2] = float("nan")
    vocab = torch.randperm(V * 3, generator=g)[:V]
    drafts = torch.full((N, 4), -1, dtype=torch.long)
    mod._launch(logits, vocab, drafts[:, 2], None, True, block=block)
    want = vocab_argmax_ref(logits, vocab)
    assert torch.equal(drafts[:, 2], want)
    assert torch.equal(drafts[:, [0, 1, 3]], torch.full((N, 3), -1, dtype=torch.long))
    assert torch.equal(want, vocab[torch.argmax(logits.float(), -1)])   # bf16 -> fp32 exact


def test_cpu_path_and_out_argument():
    g = T.gen(4)
    logits = T.randn((6, 50), g)
    vocab = torch.arange(100, 150)
    out = torch.empty(6, 3, dtype=torch.long)
    got = vocab_argmax(logits, vocab, out=out[:, 1])
    assert got.data_ptr() == out[:, 1].data_ptr()
    assert torch.equal(out[:, 1], 100 + torch.argmax(logits, -1))
    assert torch.equal(vocab_argmax(logits, vocab), out[:, 1])


def test_errors_name_the_argument():
    logits = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="^logits:"):
        vocab_argmax(logits.half(), torch.arange(8))
    with pytest.raises(ValueError, match="^vocab:"):
        vocab_argmax(logits, torch.arange(7))
    with pytest.raises(ValueError, match="^out:"):
        vocab_argmax(logits, torch.arange(8), out=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="^logits:"):
        vocab_argmax(torch.zeros(8, 2).t(), torch.arange(8))


def _keyed(g, n, z, strided=True):
    """KeyedRows over z slots (slot 0 greedy) for n rows, slots and positions as strided
    columns of [n, 2] tensors."""
    from kolibri_trt_plugins.vocab_argmax import KeyedRows
    slots = torch.randint(0, z, (n, 2), generator=g)[:, 1]
    pos = torch.randint(0, 5000, (n, 2), generator=g)[:, 0]
    temp = torch.rand(z, generator=g) * 1.5 + 0.3
    temp[0] = 0.0
    seed_key = torch.randint(0, 2**32, (z,), generator=g)
    base = torch.randint(0, 100, (z,), generator=g)
    return KeyedRows(slots, pos, temp, seed_key, base)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("N,V,block", [(1, 5, 64), (7, 300, 64), (9, 1000, 256)])
def test_keyed_interpreter_equals_reference(interp, dtype, N, V, block):
    """Keyed rows (greedy slot 0 among sampled ones) pick what the torch reference picks, into
    a strided column; the sampled rows differ from the greedy pick somewhere."""
    import importlib
    mod = importlib.import_module("kolibri_trt_plugins.vocab_argmax")
    g = T.gen(7 * N + V)
    logits = T.randn((N, V), g).to(dtype)
    vocab = torch.randperm(V * 3, generator=g)[:V]
    keyed = _keyed(g, N, 4)
    drafts = torch.full((N, 3), -1, dtype=torch.long)
    mod._launch(logits, vocab, drafts[:, 1], keyed, True, block=block)
    want = vocab_argmax_ref(logits, vocab, keyed)
    assert torch.equal(drafts[:, 1], want)
    greedy = keyed.temperature[keyed.slots] == 0
    assert torch.equal(want[greedy], vocab_argmax_ref(logits, vocab)[greedy])
    if N > 1:
        assert not torch.equal(want, vocab_argmax_ref(logits, vocab))


def test_keyed_pick_is_the_target_samplers_token():
    """With the target's own logits over the whole vocabulary, a keyed row picks exactly the
    token kolibri_trt.sampling.sample keeps at that output position (the same noise), for
    several temperatures, seeds and positions; on a slice whose other logits are -inf, too."""
    from kolibri_trt import SamplingParams, sampling
    from kolibri_trt_plugins.vocab_argmax import KeyedRows
    g = T.gen(11)
    V, n = 3000, 12
    logits = T.randn((n, V), g) * 3
    params = [SamplingParams(temperature=t, seed=s) for t, s in
              zip([0.5, 0.8, 1.0, 1.3] * 3, [1, 2**40 + 7, 12345, 2**63 + 5] * 3)]
    positions = torch.arange(n) * 37 + 3
    want = sampling.sample(logits, params, positions)
    base = torch.randint(0, 50, (n,), generator=g)
    keyed = KeyedRows(torch.arange(n), positions + base,
                      torch.tensor([p.temperature for p in params], dtype=torch.float32),
                      torch.tensor([sampling.seed_key(p.resolved_seed) for p in params]), base)
    assert torch.equal(vocab_argmax(logits, torch.arange(V), keyed=keyed), want)
    keep = torch.unique(torch.cat([want, torch.randperm(V, generator=g)[:500]]))
    masked = torch.full_like(logits, float("-inf"))
    masked[:, keep] = logits[:, keep]
    assert torch.equal(sampling.sample(masked, params, positions), want)
    assert torch.equal(vocab_argmax(logits[:, keep], keep, keyed=keyed), want)


def test_keyed_errors_name_the_argument():
    from kolibri_trt_plugins.vocab_argmax import KeyedRows
    logits = torch.zeros(2, 8)
    ok = KeyedRows(torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                   torch.zeros(3), torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="^keyed.slots:"):
        vocab_argmax(logits, torch.arange(8), keyed=ok._replace(slots=ok.slots.int()))
    with pytest.raises(ValueError, match="^keyed.positions:"):
        vocab_argmax(logits, torch.arange(8), keyed=ok._replace(positions=torch.zeros(3).long()))
    with pytest.raises(ValueError, match="^keyed.temperature:"):
        vocab_argmax(logits, torch.arange(8), keyed=ok._replace(temperature=ok.temperature.double()))
    with pytest.raises(ValueError, match="^keyed.base:"):
        vocab_argmax(logits, torch.arange(8), keyed=ok._replace(base=torch.zeros(2).long()))

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
    mod._launch(logits, vocab, drafts[:, 2], True, block=block)
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

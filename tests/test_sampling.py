"""Position-keyed sampling: same (seed, position) -> same token, whatever the batch."""

from __future__ import annotations

import math

import pytest
import torch

from kolibri_trt.sampling import (
    SamplingParams,
    filter_logits,
    gumbel_noise,
    gumbel_noise_keyed,
    row_key,
    sample,
)


def test_noise_is_keyed_by_seed_and_position_only():
    seeds = torch.tensor([7, 7, 8, -3])
    pos = torch.tensor([0, 1, 0, 5])
    noise = gumbel_noise(seeds, pos, 1000)
    alone = gumbel_noise(seeds[1:2], pos[1:2], 1000)
    assert torch.equal(noise[1], alone[0])
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    # Standard Gumbel: mean = Euler-Mascheroni constant, variance pi^2/6 (loose: 4000 draws)
    big = gumbel_noise(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 0, 0, 0]), 1000)
    assert abs(big.mean().item() - 0.5772) < 0.05
    assert abs(big.var().item() - math.pi ** 2 / 6) < 0.15
    assert torch.isfinite(big).all()


def test_sampled_frequencies_follow_softmax():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    params = SamplingParams(temperature=1.0, seed=123)
    draws = [int(sample(logits, [params], torch.tensor([n]))[0]) for n in range(3000)]
    freq = torch.bincount(torch.tensor(draws), minlength=3).float() / len(draws)
    # 3000 draws: binomial standard error <= 0.0092; 4 sigma
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.037)


def test_batch_invariance_and_greedy_ties():
    torch.manual_seed(0)
    logits = torch.randn(4, 300)
    logits[0, 10] = logits[0, 20] = 50.0          # a tie: greedy takes the lower id
    params = [SamplingParams(), SamplingParams(temperature=0.7, seed=1, top_k=20),
              SamplingParams(temperature=1.3, seed=2, top_p=0.6), SamplingParams(temperature=1.0, seed=1)]
    pos = torch.tensor([3, 4, 5, 6])
    batch = sample(logits, params, pos)
    assert batch[0] == 10
    for i in range(4):
        assert sample(logits[i:i + 1], [params[i]], pos[i:i + 1])[0] == batch[i]


def test_top_k_and_top_p_filters_keep_the_right_sets():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0]])
    kept = filter_logits(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert torch.isfinite(kept).tolist() == [[False, True, False, True, False]]
    probs = torch.tensor([[0.4, 0.35, 0.15, 0.1]])
    kept = filter_logits(probs.log(), torch.tensor([0]), torch.tensor([0.7]))
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]   # 0.4 < 0.7, 0.75 >= 0.7
    kept = filter_logits(probs.log(), torch.tensor([0]), torch.tensor([1.0]))
    assert torch.isfinite(kept).all()


@pytest.mark.parametrize("field, value", [
    ("max_tokens", 0), ("max_tokens", 1.5), ("temperature", -0.1), ("top_p", 0.0),
    ("top_p", 1.5), ("top_k", -1), ("seed", -1), ("stop", [""]), ("stop_token_ids", [-2]),
    ("ignore_eos", "yes"),
])
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})


def test_seed_none_draws_a_seed_and_stop_string_becomes_tuple():
    p = SamplingParams(temperature=1.0, stop="###")
    assert p.stop == ("###",) and 0 <= p.resolved_seed < 2 ** 64
    assert SamplingParams(seed=2 ** 64 - 1).resolved_seed == 2 ** 64 - 1


def test_host_row_keys_match_the_device_key_path():
    """row_key (host ints) gives the key gumbel_noise derives on the device: same noise bits."""
    seeds = [0, 1, 7, 2 ** 63, 2 ** 64 - 1, 0x1234_5678_9ABC_DEF0]
    pos = [0, 3, 2 ** 31, 5, 2 ** 32 + 1, 12345]
    signed = torch.tensor([s - 2 ** 64 if s >= 2 ** 63 else s for s in seeds])
    keys = torch.tensor([row_key(s, n) for s, n in zip(seeds, pos)])
    assert torch.equal(gumbel_noise_keyed(keys, 777), gumbel_noise(signed, torch.tensor(pos), 777))


@pytest.mark.parametrize("greedy_rows", [(), (1,)])
def test_sample_is_argmax_of_filtered_logits_plus_keyed_noise(greedy_rows):
    """The packed, filter-skipping fast path equals the definition, row by row and bit for bit."""
    torch.manual_seed(1)
    logits = torch.randn(4, 500) * 3
    params = [SamplingParams(temperature=0.8, seed=5), SamplingParams(temperature=1.3, seed=2 ** 64 - 3),
              SamplingParams(temperature=0.7, seed=9, top_k=40), SamplingParams(temperature=0.5, seed=1, top_p=0.9)]
    params = [SamplingParams() if i in greedy_rows else p for i, p in enumerate(params)]
    pos = [0, 17, 3, 2 ** 33]
    got = sample(logits, params, pos)
    assert torch.equal(got, sample(logits, params, torch.tensor(pos)))
    for i, p in enumerate(params):
        if p.greedy:
            assert got[i] == logits[i].argmax()
            continue
        t = torch.tensor([p.temperature], dtype=torch.float32)
        row = filter_logits(logits[i:i + 1] / t[:, None], torch.tensor([p.top_k]),
                            torch.tensor([p.top_p], dtype=torch.float32))
        seed = torch.tensor([p.resolved_seed - 2 ** 64 if p.resolved_seed >= 2 ** 63 else p.resolved_seed])
        want = torch.argmax(row + gumbel_noise(seed, torch.tensor([pos[i]]), 500), dim=-1)
        assert got[i] == want[0]
    unfiltered = [SamplingParams(temperature=0.9, seed=s) for s in range(4)]   # no sort needed
    assert torch.equal(sample(logits, unfiltered, pos), torch.stack(
        [sample(logits[i:i + 1], [unfiltered[i]], pos[i:i + 1])[0] for i in range(4)]))


@pytest.mark.parametrize("filtered", [False, True])
def test_fused_sampler_path_gives_the_same_tokens(monkeypatch, filtered):
    """FUSED_SAMPLER routes sampled rows through the gumbel_argmax op (its torch reference on
    CPU): the tokens equal the unfused path's, greedy rows untouched, with and without filters."""
    from kolibri_trt import sampling
    torch.manual_seed(2)
    logits = torch.randn(5, 3000) * 2
    extra = dict(top_k=50, top_p=0.9) if filtered else {}
    params = [SamplingParams(temperature=0.6 + 0.2 * i, seed=40 + i, **extra) for i in range(4)]
    params.insert(2, SamplingParams())
    pos = [3, 9, 0, 2 ** 20, 77]
    plain = sample(logits, params, pos)
    monkeypatch.setattr(sampling, "FUSED_SAMPLER", True)
    assert torch.equal(sample(logits, params, pos), plain)
    assert torch.equal(sample(logits[1:2], params[1:2], pos[1:2]), plain[1:2])

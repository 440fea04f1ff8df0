"""Verification of draft tokens: a pure function of the target's logits.

Lossless by construction (seed 000: "replies are the same with and without the drafter"):
the target's own token at each verified position is chosen exactly as non-speculative decoding
would choose it (argmax for greedy; the position-keyed Gumbel sample of `sampling.py` for
sampling), a draft is accepted while it equals that token, and at the first mismatch (or after
the last draft) the target's own token is taken: the bonus token. Given row-invariant target
logits, the committed tokens are those of plain decoding, token for token.

For a real draft distribution `rejection_sample` offers standard speculative sampling
(Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", Alg. 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import SamplingParams, filter_logits, sample


@dataclass(frozen=True)
class Verdict:
    """Result for one stream: `tokens` = the accepted drafts followed by the bonus token
    (len = num_accepted + 1); num_accepted counts drafts kept (0 .. len(drafts))."""

    tokens: list[int]
    num_accepted: int


def verify(logits: torch.Tensor, drafts: list[int], params: SamplingParams,
           first_position: int) -> Verdict:
    """Accept drafts while they equal the target's own choice (one stream).

    logits: fp32 [1 + k, V], row i = the target's logits after the newest token and the
    first i drafts; drafts: k draft token ids; first_position: output position n of the token
    that row 0 chooses (the sampler's key). Raises ValueError on a shape mismatch.
    """
    return verify_batch(logits, [drafts], [params], [first_position])[0]


def verify_batch(logits: torch.Tensor, drafts: list[list[int]], params: list[SamplingParams],
                 first_positions: list[int]) -> list[Verdict]:
    """:func:`verify` for S streams at once: one sampling call over every row, one copy of the
    chosen tokens to the host.

    logits: fp32 [sum_s (1 + k_s), V], stream s's rows consecutive, streams in order;
    drafts[s]: k_s draft ids; params[s], first_positions[s]: as in :func:`verify`.
    Returns one Verdict per stream. Each row's choice depends only on its own logits, its
    stream's params and its position (`sampling.sample`), so the verdicts equal S single calls.
    Raises ValueError when the row count or the list lengths do not match.
    """
    own = target_choices(logits, [len(d) for d in drafts], params, first_positions)
    return accept(own.tolist(), drafts)


def target_choices(logits: torch.Tensor, num_drafts: list[int], params: list[SamplingParams],
                   first_positions: list[int]) -> torch.Tensor:
    """The target's own token for every row of :func:`verify_batch`'s logits, on their device
    (int64 [sum_s (1 + k_s)]), k_s = num_drafts[s]: what :func:`accept` compares the drafts
    with. Raises ValueError as :func:`verify_batch`."""
    if not len(num_drafts) == len(params) == len(first_positions):
        raise ValueError(f"drafts, params, first_positions: lengths {len(num_drafts)}, "
                         f"{len(params)}, {len(first_positions)} differ")
    rows = sum(k + 1 for k in num_drafts)
    if logits.dim() != 2 or logits.shape[0] != rows:
        raise ValueError(f"logits: expected [{rows}, V], got {tuple(logits.shape)}")
    row_params, positions = [], []
    for k, p, n in zip(num_drafts, params, first_positions):
        row_params += [p] * (k + 1)
        positions += range(n, n + k + 1)
    return sample(logits, row_params, positions)


def accept(own: list[int], drafts: list[list[int]]) -> list[Verdict]:
    """Verdicts from the target's choices `own` (:func:`target_choices`, on the host): stream
    s keeps its drafts while they equal its rows' choices, then takes the next choice."""
    out, r = [], 0
    for d in drafts:
        accepted = 0
        while accepted < len(d) and d[accepted] == own[r + accepted]:
            accepted += 1
        out.append(Verdict(own[r:r + accepted + 1], accepted))
        r += len(d) + 1
    return out


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sampling draws from: softmax(filter(logits / T)); fp32 [N, V]."""
    n = logits.shape[0]
    scaled = logits.float() / params.temperature
    dev = logits.device
    scaled = filter_logits(scaled, torch.full((n,), params.top_k, device=dev),
                           torch.full((n,), params.top_p, dtype=torch.float32, device=dev))
    return torch.softmax(scaled, dim=-1)


def rejection_sample(target_p: torch.Tensor, draft_q: torch.Tensor, drafts: list[int],
                     generator: torch.Generator) -> Verdict:
    """Speculative sampling: accept draft x_i with probability min(1, p_i(x)/q_i(x)); at the
    first rejection sample from norm(max(0, p_i - q_i)); if all pass, sample from p_k.

    target_p: fp32 [k+1, V]; draft_q: fp32 [k, V] (the proposer's distributions); drafts: the
    k tokens drawn from draft_q. The output is distributed exactly as sampling from target_p.
    """
    out = []
    for i, x in enumerate(drafts):
        p, q = float(target_p[i, x]), float(draft_q[i, x])
        if q > 0 and torch.rand((), generator=generator).item() < min(1.0, p / q):
            out.append(x)
            continue
        residual = (target_p[i] - draft_q[i]).clamp_min(0)
        residual = residual / residual.sum() if residual.sum() > 0 else target_p[i]
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return Verdict(out, i)
    out.append(int(torch.multinomial(target_p[len(drafts)], 1, generator=generator)))
    return Verdict(out, len(drafts))

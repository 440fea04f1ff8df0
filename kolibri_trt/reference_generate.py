"""The plain reference generation loop: no KV cache, no drafting, one sequence at a time.

Every step re-runs `KolibriForCausalLM` over the whole sequence and samples the next token
with the position-keyed sampler of `sampling.py`. This is the baseline that every faster path
(paged cache, batching, CUDA graphs, speculative decoding) must reproduce token for token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .model.reference import KolibriForCausalLM
from .sampling import SamplingParams, sample


@dataclass(frozen=True)
class ReferenceOutput:
    """token_ids: generated ids (EOS / stop id included if one ended generation);
    finish_reason: "stop" (EOS or a stop id) or "length" (max_tokens reached)."""

    token_ids: list[int]
    finish_reason: str


@torch.no_grad()
def reference_generate(model: KolibriForCausalLM, prompt_ids: Sequence[int],
                       params: SamplingParams) -> ReferenceOutput:
    """Generate up to `params.max_tokens` tokens after `prompt_ids` (non-empty list of ids).

    Stops at the model's EOS ids (unless `ignore_eos`) or `stop_token_ids`. Stop strings need
    the tokenizer and are the runtime's job; the reference loop does not apply them.

    Raises:
        ValueError: an empty prompt, a token id outside the vocabulary, or a prompt plus
            max_tokens longer than max_position_embeddings.
    """
    vocab = model.config.vocab_size
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids: must hold at least one token")
    if any(not 0 <= int(t) < vocab for t in prompt_ids):
        raise ValueError(f"prompt_ids: token ids must be in [0, {vocab})")
    if len(prompt_ids) + params.max_tokens > model.config.max_position_embeddings:
        raise ValueError("prompt_ids: prompt plus max_tokens exceeds max_position_embeddings")
    stops = set(params.stop_token_ids)
    if not params.ignore_eos:
        stops |= set(model.config.eos_token_ids)
    device = model.lm_head.weight.device
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    out: list[int] = []
    for n in range(params.max_tokens):
        logits = model.last_logits(ids)
        token = int(sample(logits, [params], torch.tensor([n], device=device))[0])
        out.append(token)
        if token in stops:
            return ReferenceOutput(out, "stop")
        ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
    return ReferenceOutput(out, "length")

"""A step's verification on the engine side (`LLMEngine.step`): every sampling stream's verdict
from the target pass's logits, the drafter's drafts left on the device read in the same copy
to the host as the target's own tokens. The maths is `spec/verify.py`'s pure functions."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..spec.speculator import Speculator
from ..spec.verify import Verdict, accept, rejection_sample, target_choices, target_probs
from .sequence import Sequence


class TokenReader:
    """Reads a step's chosen tokens to the host: on CUDA one non-blocking copy into pinned
    memory (grown on demand) and an event, so that work enqueued between the copy and the
    wait (`read`'s `before`: a chained drafter round) runs while the host waits and after."""

    def __init__(self):
        self.host: torch.Tensor | None = None
        self.done: torch.cuda.Event | None = None

    def read(self, values: torch.Tensor, before: Callable[[], None] | None = None) -> list[int]:
        """values int64 [N] -> N ints; `before()` is called after the copy is enqueued."""
        if values.device.type != "cuda":
            if before is not None:
                before()
            return values.tolist()
        n = values.numel()
        if self.host is None or self.host.numel() < n:
            self.host = torch.empty(max(n, 256), dtype=torch.long, pin_memory=True)
            self.done = torch.cuda.Event()
        host = self.host[:n]
        host.copy_(values, non_blocking=True)
        self.done.record()
        if before is not None:
            before()
        self.done.synchronize()
        return host.tolist()


def verify_step(seqs: list[Sequence], logits: torch.Tensor, extra: dict[str, list[int]],
                speculator: Speculator, acceptance_method: str, on_device=None,
                reader: TokenReader | None = None,
                before_read: Callable[[torch.Tensor], None] | None = None
                ) -> dict[str, Verdict]:
    """Verdicts for every sampling stream of `seqs` (logits: fp32 [sum (1 + k), V], 1 + k rows
    per stream, in order; extra[request id]: its k drafts). Position-keyed streams go through
    one `target_choices` call and one host copy. With acceptance_method "rejection_sampler"
    and T > 0: speculative sampling with a one-hot q (both proposers draft deterministically),
    randomness from a generator seeded with the request's seed.
    on_device: `LLMEngine._forward_deferred`'s (drafts int64 [S, n] on the device, request id
    -> offset of its row flattened) for drafts that stand as zeros in `extra`: read in the
    keyed streams' copy (or on the host first, `Speculator.resolve_deferred`, when a stream
    samples by rejection); `extra`'s lists get them in place, and the round is ended.
    reader: reads the chosen tokens (`TokenReader`; None: a synchronous `.tolist()`);
    before_read(own): called with the target's own tokens (int64 [rows] on the device) after
    their copy to the host is enqueued and before the host waits for it, when every stream
    is position-keyed (the engine's chained drafter round)."""
    keyed, spans, out, row = [], [], {}, 0
    rejection = {q.request_id for q in seqs if acceptance_method != "position-keyed"
                 and extra.get(q.request_id) and q.params.temperature != 0}
    if on_device is not None and rejection:
        put_host_drafts(extra, speculator.resolve_deferred())
        on_device = None
    for seq in seqs:
        d = extra.get(seq.request_id, [])
        span = (row, row + 1 + len(d))
        row = span[1]
        if seq.request_id in rejection:
            out[seq.request_id] = _rejection(seq, logits[span[0]:span[1]], d)
        else:
            keyed.append(seq)
            spans.append(span)
    if keyed:
        rows = logits if len(keyed) == len(seqs) else torch.cat(
            [logits[a:b] for a, b in spans])
        hook = before_read if len(keyed) == len(seqs) else None
        out.update(_verify_keyed(keyed, rows, extra, speculator, on_device, reader, hook))
    elif on_device is not None:
        speculator.discard_deferred()
    return out


def _rejection(seq: Sequence, logits: torch.Tensor, drafts: list[int]) -> Verdict:
    """Speculative sampling of one stream (logits: its 1 + k rows) against one-hot drafts."""
    if seq.generator is None:
        seq.generator = torch.Generator().manual_seed(seq.params.resolved_seed)
    p = target_probs(logits, seq.params).cpu()
    q = torch.zeros(len(drafts), p.shape[1])
    q[torch.arange(len(drafts)), torch.tensor(drafts)] = 1.0
    return rejection_sample(p, q, drafts, seq.generator)


def _verify_keyed(keyed: list[Sequence], rows: torch.Tensor, extra: dict[str, list[int]],
                  speculator: Speculator, on_device, reader: TokenReader | None,
                  before_read) -> dict[str, Verdict]:
    """`verify_step`'s position-keyed streams: their rows' own tokens, with the deferred
    drafts (on_device) in the same copy to the host, then `accept`."""
    own = target_choices(rows, [len(extra.get(q.request_id, ())) for q in keyed],
                         [q.params for q in keyed], [len(q.output_token_ids) for q in keyed])
    values = own if on_device is None else torch.cat([own, on_device[0].view(-1)])
    before = None if before_read is None else (lambda: before_read(own))
    both = values.tolist() if reader is None and before is None else \
        (reader or TokenReader()).read(values, before)
    if on_device is None:
        chosen = both
    else:
        drafts, offsets = on_device
        chosen, flat = both[:own.numel()], both[own.numel():]
        width = int(drafts.shape[1])
        put_host_drafts(extra, {rid: flat[o:o + width] for rid, o in offsets.items()})
        speculator.discard_deferred()
    found = accept(chosen, [extra.get(q.request_id, []) for q in keyed])
    return {q.request_id: v for q, v in zip(keyed, found)}


def put_host_drafts(extra: dict[str, list[int]], drafts: dict[str, list[int]]) -> None:
    """Replace the placeholder drafts in `extra`'s lists, in place, by the real ones."""
    for rid, tokens in drafts.items():
        if rid in extra:
            extra[rid][:] = tokens[:len(extra[rid])]

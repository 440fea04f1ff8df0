"""What a step of `LLMEngine` hands the drafter's kernel path (`PluginDrafterProposer`): where
the target pass writes the taps (`taps_dst`), where the deferred drafts go in the pass's
inputs (`deferred_slots`), and which streams get a chained round while the step is verified
(`chain_items`, `spec/drafter_chain.py`)."""

from __future__ import annotations

from ..spec.deferred_drafts import DeferredDrafts
from ..spec.plugin_drafter_proposer import PluginDrafterProposer
from .scheduler import ScheduledSeq


def taps_dst(prop: PluginDrafterProposer, scheduled: list[ScheduledSeq],
             extra: dict[str, list[int]]) -> list[int]:
    """One history row per token of the step (`PluginDrafterProposer.taps_dst`; -1: none)."""
    dst = []
    for item in scheduled:
        rid = item.seq.request_id
        n = item.num_tokens + (len(extra.get(rid, ())) if item.samples else 0)
        dst += prop.taps_dst(rid, item.start, n)
    return dst


def deferred_slots(scheduled: list[ScheduledSeq], extra: dict[str, list[int]],
                   deferred: DeferredDrafts) -> tuple[list[int], list[int], dict[str, int]]:
    """(dst, src, row_of): token dst[i] of the step takes the deferred round's flattened
    draft src[i]; row_of: request id -> offset of its row in the round's drafts flattened."""
    width = int(deferred.drafts.shape[1])
    row_of = {rid: i * width for i, rid in enumerate(deferred.request_ids) if rid is not None}
    dst, src, first = [], [], 0
    for item in scheduled:
        rid = item.seq.request_id
        n = len(extra.get(rid, ())) if item.samples else 0
        if n and rid in row_of:
            a = first + item.num_tokens
            dst.extend(range(a, a + n))
            src.extend(range(row_of[rid], row_of[rid] + n))
        first += item.num_tokens + n
    return dst, src, row_of


def chain_items(scheduled: list[ScheduledSeq], extra: dict[str, list[int]],
                drafts: dict[str, tuple[list[int], list[str]]], after_copy: bool = True
                ) -> list[tuple[str, int, int, int]] | None:
    """The streams of a step that get a chained round (`Speculator.chain`): (request id,
    first row, start position, drafts) of each stream, when every stream of the step is in
    decode and samples (so that token rows are logits rows); else None. after_copy False:
    only streams whose step had no copy drafts (their copy lookup missed, the next one
    likely misses too); True: copy-drafted streams too, so that a stream whose next lookup
    misses finds its round done, and its drafter state never lags behind its tokens (a
    round it does not take is dropped, its GPU time spent while the host prepares the next
    step)."""
    if not all(item.samples and item.num_tokens == 1 for item in scheduled):
        return None
    out, first = [], 0
    for item in scheduled:
        rid = item.seq.request_id
        k = len(extra.get(rid, ()))
        sources = drafts.get(rid, ([], []))[1]
        if after_copy or not sources or sources[0].startswith("drafter"):
            out.append((rid, first, item.start, k))
        first += 1 + k
    return out or None

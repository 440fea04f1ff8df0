"""Rounds of the block drafter driven through two proposers side by side (the reference
`DrafterProposer` and `PluginDrafterProposer`), for tests/test_plugin_drafter.py and
bench/gpu_drafter.py (no pytest here)."""

from __future__ import annotations

import torch

VOCAB = 2000


def reference_round(prop, items):
    """`DrafterProposer.propose_batch` keeping the logits: (drafts, logits) of ready streams."""
    ready = []
    for rid, tokens in items:
        st = prop.streams.get(rid)
        if st is not None and st.num_positions == len(tokens) - 1:
            p = st.num_positions - 1
            prop._extend_context(st, tokens, p)
            ready.append((st, p, tokens[p + 1]))
    fused = torch.stack([st.fused[-1] for st, _, _ in ready])
    nxt = torch.tensor([t for *_, t in ready], device=fused.device)
    return prop.drafter.propose_cached(fused, nxt, [p for _, p, _ in ready],
                                       [st.kv for st, _, _ in ready], prop.depth)


def drive(ref, new, rounds=4, seed=0, lengths=(1, 3, 8, 9, 20), vocab=VOCAB):
    """Streams of `lengths` observed positions (prefill in two chunks); each round the
    streams in it draft with both proposers (`ref` may be None: the new one only), then
    commit 1 + k tokens (k = 0..3 of the drafts accepted, then a random bonus token) with
    random taps. Round 1 holds only the first two streams; the last stream first drafts in
    round 2; the first leaves after round 1 but keeps committing. Yields (ref drafts, ref
    logits, new drafts, new logits) per round (ref's None without ref); tensors on the
    proposers' devices."""
    cfg = new.drafter.config
    g = torch.Generator().manual_seed(seed)
    n_streams = len(lengths)
    tokens = {f"r{i}": torch.randint(0, vocab, (n + 1,), generator=g).tolist()
              for i, n in enumerate(lengths)}
    props = [p for p in (ref, new) if p is not None]

    def taps(n):
        return (torch.randn(n, cfg.num_taps, cfg.target_hidden_size, generator=g) * 3
                ).to(torch.bfloat16)

    for rid, t in tokens.items():
        n = len(t) - 1
        first, half = taps(n), max(1, n // 2)
        for prop in props:
            prop.observe(rid, 0, first[:half])
            if n > half:
                prop.observe(rid, half, first[half:])
    names_all = list(tokens)
    for r in range(rounds):
        if r == 0:
            names = names_all[:-1]
        elif r == 1:
            names = names_all[:2]
        else:
            names = names_all[1:]
        items = [(rid, tokens[rid]) for rid in names]
        d_ref = l_ref = None
        if ref is not None:
            d_ref, l_ref = reference_round(ref, items)
        ready, d_new, l_new = new.propose_tensors(items)
        assert ready == names, (ready, names)
        yield d_ref, l_ref, d_new, l_new
        base = (d_ref if d_ref is not None else d_new).cpu()
        for rid, d in zip(names, base):
            k = (r + int(rid[1:])) % 4
            commit = [int(x) for x in d[:k]] + [int(torch.randint(0, vocab, (1,), generator=g))]
            start, rows = len(tokens[rid]) - 1, taps(len(commit))
            for prop in props:
                prop.observe(rid, start, rows)
            tokens[rid] = tokens[rid] + commit
        if r >= 1 and n_streams > 2:      # the first stream keeps committing while out
            rid = names_all[0]
            start, rows = len(tokens[rid]) - 1, taps(2)
            for prop in props:
                prop.observe(rid, start, rows)
            tokens[rid] = tokens[rid] + [7, 9]


def compare(d_ref, l_ref, d_new, l_new, draft_vocab):
    """Per stream: drafts equal count, max |logit diff| on rows up to (and with) the first
    differing draft, and the reference's logit gap between its draft and the other one at
    that first difference (0 when none). Returns (equal, total, worst diff, worst gap)."""
    d_new, l_new = d_new.cpu(), l_new.cpu().float()
    l_ref = l_ref.float()
    vocab = draft_vocab.cpu()
    equal = total = 0
    worst = worst_gap = 0.0
    for s in range(d_ref.shape[0]):
        same = d_ref[s] == d_new[s]
        equal += int(same.sum())
        total += same.numel()
        diff = (~same).nonzero()
        first = int(diff[0]) if diff.numel() else same.numel()
        rows = slice(0, min(first + 1, same.numel()))
        worst = max(worst, (l_ref[s, rows] - l_new[s, rows]).abs().max().item())
        if first < same.numel():
            i_ref = int((vocab == d_ref[s, first]).nonzero())
            i_new = int((vocab == d_new[s, first]).nonzero())
            worst_gap = max(worst_gap, (l_ref[s, first, i_ref] - l_ref[s, first, i_new]).item())
    return equal, total, worst, worst_gap

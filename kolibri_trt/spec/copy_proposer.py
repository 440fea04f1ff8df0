"""Copy drafting (prompt lookup): propose what followed the longest recent suffix earlier on.

For n from `max_ngram` down to `min_ngram`, the last n tokens of prompt + output are looked up
among earlier n-grams; on a hit the tokens that followed the most recent earlier occurrence are
proposed (up to k). The index holds only committed tokens, so a rejected draft leaves no trace.
"""

from __future__ import annotations


class CopyIndex:
    """Per-stream n-gram index: n-gram -> position of the token that followed its most
    recent occurrence. Only n-grams with a follower are indexed, so the current suffix
    never matches itself."""

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"min_ngram/max_ngram: need 1 <= min <= max, got {min_ngram}, "
                             f"{max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        """Append committed tokens and index the n-grams that now have a follower."""
        for tok in tokens:
            self.tokens.append(tok)
            follow = len(self.tokens) - 1           # position of the token just added
            for n in range(self.min_ngram, self.max_ngram + 1):
                if follow - n >= 0:
                    self.table[tuple(self.tokens[follow - n:follow])] = follow

    def propose(self, k: int) -> list[int]:
        """Up to k draft tokens continuing the current suffix, or [] on a miss."""
        if k <= 0:
            return []
        toks = self.tokens
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(toks) < n:
                continue
            follow = self.table.get(tuple(toks[-n:]))
            if follow is not None:
                return self._continue(follow, k)
        return []

    def _continue(self, follow: int, k: int) -> list[int]:
        """Copy from `follow` on; past the end, keep copying the draft itself (a period of
        len(tokens) - follow), so repetitive text drafts the full k."""
        toks, out = self.tokens, []
        for i in range(k):
            j = follow + i
            out.append(toks[j] if j < len(toks) else out[j - len(toks)])
        return out

"""The first-maximum walk shared by the row-argmax kernels (gumbel_argmax, vocab_argmax): one
program per row walks V in fixed chunks in order, keeping a running (max, first index) and the
first NaN, which is torch.argmax's rule (ties to the lowest index, NaN counts as the largest, an
all -inf row gives 0). Max and first index are exact, so a row's result depends on nothing but
its own values.
"""

from __future__ import annotations

from ._common import jit, tl


@jit
def argmax_step(val, offs, m, V, best, best_i, nan_i):
    """Fold one chunk into the walk: val fp32 [BLOCK] (its scores), offs int32 [BLOCK] (their
    indices), m bool [BLOCK] (in range); best / best_i / nan_i the running max, its first index
    and the first NaN's index (V = none). Returns the updated (best, best_i, nan_i)."""
    isnan = (val != val) & m  # noqa: PLR0124 (NaN test)
    nan_i = tl.minimum(nan_i, tl.min(tl.where(isnan, offs, V), 0))
    val = tl.where(m & ~isnan, val, float("-inf"))
    cmax = tl.max(val, 0)
    cidx = tl.min(tl.where(val == cmax, offs, V), 0)   # first index of the chunk's max
    upd = cmax > best                                  # strict: earlier chunks win ties
    return tl.where(upd, cmax, best), tl.where(upd, cidx, best_i), nan_i

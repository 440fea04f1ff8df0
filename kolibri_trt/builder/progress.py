"""A tqdm progress bar on stderr (stdout carries only the engine path)."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """Counts build steps; `grow(n)` adds steps once their number is known, `advance(what)`
    finishes one step and shows `what`. Disabled: every call is a no-op."""

    def __init__(self, enabled: bool = True):
        self.bar = tqdm(total=0, unit="step", file=sys.stderr, disable=not enabled,
                        dynamic_ncols=True, desc="build")

    def grow(self, steps: int) -> None:
        self.bar.total += steps
        self.bar.refresh()

    def advance(self, what: str | None = None, steps: int = 1) -> None:
        if what is not None:
            self.bar.set_description_str(what, refresh=False)
        self.bar.update(steps)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()

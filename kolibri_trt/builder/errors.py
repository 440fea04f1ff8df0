"""The builder's error type: every message names the offending input (option, file, key)."""

from __future__ import annotations


class BuildError(ValueError):
    """A build input is wrong: unknown target or option, a recipe file that does not check,
    an output folder that exists, a scheme the checkpoint cannot take. The message names the
    option, file or key at fault and what was expected."""

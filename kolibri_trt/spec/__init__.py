"""Speculative decoding: proposers (copy, block drafter), verification, metrics."""

from .metrics import SpecMetrics
from .speculator import MODES, Speculator
from .verify import Verdict, rejection_sample, verify

__all__ = ["MODES", "SpecMetrics", "Speculator", "Verdict", "rejection_sample", "verify"]

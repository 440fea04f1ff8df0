"""Serving front ends on the runtime: the shared engine loop (and, in later modules, the
OpenAI-compatible HTTP server and the Triton Inference Server model)."""

from .engine_loop import EngineLoop, QueueFull

__all__ = ["EngineLoop", "QueueFull"]

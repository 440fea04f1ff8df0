"""The runtime: engines, paged KV cache, continuous batching, sampling, streaming."""

from .engine import EngineArgs, LLMEngine
from .llm import LLM
from .output import RequestMetrics, RequestOutput

__all__ = ["EngineArgs", "LLM", "LLMEngine", "RequestMetrics", "RequestOutput"]

"""kolibri-trt: a compiled-graph serving backend for Aleph Alpha's Kolibri-1."""

from .config import KolibriConfig
from .drafter import DrafterConfig, DrafterTarget, KolibriBlockDrafter
from .errors import CheckpointError
from .model.reference import KolibriForCausalLM
from .runtime import LLM, RequestOutput
from .sampling import SamplingParams

__version__ = "0.1.0"

__all__ = ["CheckpointError", "DrafterConfig", "DrafterTarget", "KolibriBlockDrafter",
           "KolibriConfig", "KolibriForCausalLM", "LLM", "RequestOutput", "SamplingParams",
           "__version__"]

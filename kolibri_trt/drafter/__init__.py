"""The Kolibri-1 block drafter (`shared/spec/block-drafter.md`)."""

from .block_drafter import BlockProposal, KolibriBlockDrafter
from .config import DrafterConfig, ServingDefaults
from .reference import DrafterTarget

__all__ = ["BlockProposal", "DrafterConfig", "DrafterTarget", "KolibriBlockDrafter",
           "ServingDefaults"]

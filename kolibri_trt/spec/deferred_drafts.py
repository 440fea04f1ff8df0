"""`DeferredDrafts`: a drafter round's drafts left on the device until verification (the
drafter's kernel path, `plugin_drafter_proposer.py`; `Speculator`'s `defer`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DeferredDrafts:
    """The drafts of a launched round, left on the device: the target pass reads them from
    there (`PluginRunner.forward`'s draft_ids), the host only at verification, in the copy
    of the target's tokens (`runtime/step_verification.py`; `collect` reads them alone), so
    no host sync sits between the round and the pass."""

    request_ids: list[str | None]        # the round's streams in its row order (None: a row
                                         # of a chained round no stream drafts with)
    drafts: torch.Tensor                 # int64 [S, depth*B] target ids, the drafter's device:
                                         # the head of DrafterRunner.drafts_out
    stream: torch.cuda.Stream | None     # the round's CUDA stream (None on CPU)
    flat: torch.Tensor                   # int64 [S*depth*B]: drafts flattened (the same ids)

    def ready_here(self) -> None:
        """Make the current CUDA stream wait for the round (and keep `drafts`'s memory alive
        for its reads there); nothing on CPU."""
        if self.stream is not None:
            current = torch.cuda.current_stream(self.drafts.device)
            current.wait_stream(self.stream)
            self.drafts.record_stream(current)

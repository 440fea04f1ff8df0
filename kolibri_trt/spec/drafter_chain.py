"""Chained drafter rounds: the next step's round enqueued right behind the target pass that it
follows, its inputs computed on the device (`ChainedRound`, used by `PluginDrafterProposer.chain`).

A round needs, per stream, the accepted drafts a of the step just verified: its anchor is
p = start + a (start: the step's first position, the newest committed token), its next token
the target's own token at row row0 + a (the bonus token), and its commit rows are positions
start - 1 .. start - 1 + a, whose next tokens are the step's inputs at rows row0 .. row0 + a
(the committed token, then the accepted drafts). Greedy or position-keyed, a is the number of
leading drafts equal to the target's own token at their row (`spec/verify.py`: `accept`), which
the device knows as soon as it has the target's own tokens. So the engine enqueues the round
between those tokens' copy to the host and the host's wait for them: the round runs while the
host verifies, commits and prepares the next step, with no launch of its own after the step
(the prefetch's `DrafterRunner.step`: staging, upload, replay, 0.09 ms of host time per round on
the H200, bench/results/h200-2026-11-30h/zq/split_copy_drafter.log), and its graph time hides
behind the host's. Its graphs are captured at start-up (`capture_all`: one per stream bucket
and ring length).

It equals the round `PluginDrafterProposer.launch` would stage after the step for the same
streams (`_collect`: commit rows kv_end .. p - 1, next ids tokens[q + 1]) when the stream's
last round was anchored at start - 1 (kv_end = start - 1), which the proposer checks. One
graph per (commit bucket, stream bucket, ring length) holds the device prologue (`chain_index`),
`DrafterPlugin.commit` and `DrafterPlugin.propose` (`DrafterRunner._commit_step`,
`_round_step`). Host work per chained round: one upload of 5 ints per stream, one device copy
(the target's own tokens into a static buffer; the input ids are read where the target's
graphs keep them, `use_inputs`, or copied too), one replay.
"""

from __future__ import annotations

import numpy as np
import torch
from kolibri_trt_plugins.chain_index import FIELDS, chain_index  # FIELDS: ints per stream
from .drafter_runner import MIN_COMMIT, DrafterRunner, _pow2


class ChainedRound:
    """Device-side inputs of a round that follows a verified step (module docstring).

    runner: the proposer's `DrafterRunner` (its index buffer, graphs, ring and history);
    max_drafts: most drafts of one stream in a step (num_speculative_tokens); max_tokens: most
    token rows of a step (the target runner's max_t)."""

    def __init__(self, runner: DrafterRunner, max_drafts: int, max_tokens: int):
        if max_drafts < 1 or max_tokens < 1:
            raise ValueError(f"max_drafts, max_tokens: must be >= 1, got {max_drafts}, "
                             f"{max_tokens}")
        dev = runner.model.device
        self.runner, self.width = runner, max_drafts + 1      # commit rows per stream, at most
        s = runner.max_s
        self.fields = torch.zeros(FIELDS, s, dtype=torch.long, device=dev)
        cuda = dev.type == "cuda"
        self.stage = torch.zeros(FIELDS, s, dtype=torch.long, pin_memory=True) if cuda \
            else self.fields
        self.stage_np = self.stage.numpy()
        self.uploaded = torch.cuda.Event() if cuda else None
        # row 0: the step's input ids (with its drafts), row 1: the target's own tokens
        self.tokens = torch.zeros(2, max_tokens + 1, dtype=torch.long, device=dev)
        self.offsets = torch.as_tensor(runner.offsets.reshape(runner.depth, -1), device=dev)
        self.inputs = self.tokens[0]       # what the prologue reads the input ids from
        self.bound = False                 # inputs is a buffer of the target's (use_inputs)

    def use_inputs(self, buffer: torch.Tensor) -> None:
        """Read the step's input ids from `buffer` (int64 [>= max_tokens + 1] on the device,
        at a fixed address: the target runner's static input_ids) instead of a copy of them
        per round; `launch`'s inputs must then start at that address. Raises ValueError once
        a chain graph is captured, or for a wrong buffer."""
        if any(k[0] == "chain" for k in self.runner.graphs):
            raise ValueError("use_inputs: chain graphs are captured already")
        dev = self.fields.device
        if buffer.dtype != torch.long or buffer.dim() != 1 or buffer.device != dev \
                or buffer.numel() < self.tokens.shape[1]:
            raise ValueError(f"buffer: int64 [>= {self.tokens.shape[1]}] on {dev}, "
                             f"got {buffer.dtype} {tuple(buffer.shape)} on {buffer.device}")
        self.inputs, self.bound = buffer, True

    @torch.no_grad()
    def capture_all(self) -> int:
        """Capture every chain graph now (one per stream bucket and ring length whose commit
        rows fit) and replay each once (its upload), on padding: no valid stream, only the trash slot written. Returns the number
        captured. ValueError without graphs."""
        r = self.runner
        if not r.use_graphs:
            raise ValueError("use_graphs: capture_all needs CUDA graphs on")
        self.uploaded.synchronize()
        self.stage_np[:] = 0
        self.fields.copy_(self.stage)
        count = 0
        for s_b, length in r.round_buckets():
            n_b = self.commit_bucket(s_b)
            key = ("chain", n_b, s_b, length)
            if n_b <= r.max_commit and key not in r.graphs:
                r.graphs[key] = r._capture(lambda n=n_b, s=s_b, L=length: self._steps(n, s, L))
                r.graphs[key][0].replay()           # uploaded now (first launch)
                count += 1
        return count

    def reads(self, inputs: torch.Tensor) -> bool:
        """Whether `launch` can take these input ids: any tensor while none is bound, else
        only one that starts at the `use_inputs` buffer (a step the target ran outside its
        graphs keeps its ids elsewhere)."""
        return not self.bound or inputs.data_ptr() == self.inputs.data_ptr()

    def commit_bucket(self, s_b: int) -> int:
        return max(MIN_COMMIT, _pow2(s_b * self.width))

    def launch(self, rows: list[tuple[int, int, int, int]], own: torch.Tensor,
               inputs: torch.Tensor) -> torch.Tensor:
        """Enqueue the round of S streams: rows[s] = (first row of the stream in the step,
        its drafts k, its start position, its ring slot); own int64 [T]: the target's own
        token per row; inputs int64 [>= T]: the step's input ids as the target read them (the
        drafts put in). Returns the drafts int64 [S, depth*B] on the device (a view of the
        graph's output, valid until the runner's next step; also in `drafts_out`).

        Raises ValueError when S exceeds the runner's slots, the rows exceed its largest
        commit bucket, T exceeds max_tokens, a round would pass the RoPE table
        (max_model_len), or inputs is not the `use_inputs` buffer once one is given."""
        r, s, t = self.runner, len(rows), int(own.numel())
        s_b = _pow2(s)
        n_b = self.commit_bucket(s_b)
        if s_b > r.max_s or n_b > r.max_commit or t >= self.tokens.shape[1]:
            raise ValueError(f"chained round: {s} streams of up to {self.width} commit rows, "
                             f"{t} token rows do not fit (slots {r.max_s}, commit bucket "
                             f"{r.max_commit}, rows {self.tokens.shape[1] - 1})")
        b = r.model.config.block_size
        top = max(start + k for _, k, start, _ in rows) + r.depth * b - 1
        if top >= r.max_positions:
            raise ValueError(f"max_model_len: a round reaches position {top}, the runner's RoPE "
                             f"table holds positions < {r.max_positions}")
        if self.uploaded is not None:
            self.uploaded.synchronize()          # the stage's last upload is done
        st = self.stage_np
        st[:4, :s] = np.asarray(rows, dtype=np.int64).T
        st[4, :s] = 1
        st[:, s:s_b] = 0
        if self.uploaded is not None:
            self.fields.copy_(self.stage, non_blocking=True)
            self.uploaded.record()
        if not self.reads(inputs):
            raise ValueError("chained round: inputs must start at the buffer given to "
                             "use_inputs")
        if not self.bound:
            self.tokens[0, :t].copy_(inputs[:t])
        self.tokens[1, :t].copy_(own)
        length = r.length_bucket(top - r.depth * b + 1)
        drafts, _ = r._replay(("chain", n_b, s_b, length),
                              lambda: self._steps(n_b, s_b, length),
                              parts=(("commit", n_b), ("round", s_b, length, False)))
        return drafts[:s]

    def _steps(self, n_b: int, s_b: int, length: int):
        """The graphed chain of bucket (n_b, s_b, length): prologue, commit, round."""
        self._prologue(n_b, s_b)
        self.runner._commit_step(n_b)
        return self.runner._round_step(s_b, length)

    def _prologue(self, n_b: int, s_b: int) -> None:
        """Write the round's and the commit's index columns (`DrafterRunner` layout) from the
        fields and tokens, as `_stage_round` / `_stage_commit` would from the host: padding
        streams and rows past a stream's a + 1 commit rows as their padding (one launch:
        `kolibri_trt_plugins.chain_index`)."""
        r = self.runner
        chain_index(self.fields, self.inputs, self.tokens[1], self.offsets, r.r_idx, r.c_idx,
                    s_b, n_b, self.width, r.ring.size, r.history_rows, r.ring.trash)

"""`DrafterRunner`: the block drafter's rounds over padded static buffers, replayed from CUDA
graphs (the engine of `PluginDrafterProposer`, `plugin_drafter_proposer.py`).

A round (`step`) is two batched steps of `DrafterPlugin`:
1. commit: N context rows into the ring (`DrafterPlugin.commit`);
2. round: `depth` passes for S streams (`DrafterPlugin.propose`).
Both take their taps rows from the taps history `history` (bf16 [slots * W + spare rows,
n_taps, Ht], W = `history_rows` = context_window + step_tokens rows per ring slot; position q
of the stream in slot s is row s * W + q % W; the spare rows, from `spare` on, take a
target step's padding): the target's passes write it (inside their graphs:
`PluginRunner.use_taps_sink`; or `write_history` from a taps tensor), each step's taps GEMV
reads its rows by index (`DrafterPlugin.fuse_taps`), so a round copies no taps. A pass of at most step_tokens
tokens per stream overwrites only positions more than context_window behind its first one,
which no later round reads (a commit reaches at most context_window back). The int64 indices
of both steps live in one static buffer `idx` [6, max_commit + depth * max_s * B], columns:
the commit's (max_commit), then the round's. Commit column i, rows: next id, slot, position,
history row, ring row (position % R), RoPE table row (the position, 0 for padding's -1).
Round, stream s of a bucket of S_b streams: rows 0, 1, 3 column s: next id, slot, history row
of the anchor; row 2 [depth, S_b]: pass r's anchor p + r*B; rows 4, 5 [depth, S_b, B]: block
row j's position p + r*B + j (also its RoPE table row) and ring row (each pass's [S_b] /
[S_b, B] slice contiguous, as the plugins take them). Everything that depends only on
positions is computed here on the host (numpy), so the graphed steps run no remainder, add or
RoPE op: one index_select of the RoPE table (`DrafterPlugin.rope_table`, positions 0 ..
max_model_len + depth*B - 1, made once) per step. On CUDA the host writes them into a pinned
copy (`stage`) and uploads it with one non-blocking copy; on CPU `stage` is `idx`, written in
place.

Device operations per round on CUDA: 1 index upload, 1 graph replay (2 after a commit of more
than MERGE_COMMIT rows), and, when the host reads the drafts (`read_drafts`, `propose_batch`),
1 copy of them into pinned memory, then 1 event wait: the round's only host sync. (Drafts
left on the device are read by the engine with the verification's tokens instead.)

Buckets: commit N rows -> N_b = next power of two >= 8, at most `max_commit` (larger commits
run in chunks); round S streams -> S_b = next power of two, and L ring rows attended = the
smallest of 256, 512, ... >= max(p) + depth*B, or R (all). Padding rows and streams use the
ring's trash slot (slot trash, position -1 / anchor 0, history row 0). Graphs: one per commit
bucket plus one per (S_b, L): 5 + 4 * 5 = 25 for the mini engine (8 streams, context window
2048, depth 1), 8 + 7 * 5 = 43 at 64 streams; plus, for commits of at most MERGE_COMMIT rows
(a decode step's accepted tokens), one graph per (N_b, S_b, L) holding commit and round, so
that a steady round is one replay call: 2 * 20 = 40 more for the mini engine, 2 * 35 = 70 at
64 streams (larger commits, after a prefill, replay the two apart). Serving rounds return no
logits (the heads' argmax reads the head's output: no fp32 copy); a round with logits
(`step(..., logits=True)`, tests) is its own graph, key ("round", S_b, L, True). Each graph
is captured on first use (or by `capture_all` at start-up, the serving ones) after one eager
warm-up run that writes what the replay writes again; on CPU, or with graphs off, the same
padded inputs run eagerly.
"""

from __future__ import annotations

import numpy as np
import torch

from ..drafter.plugin_drafter import DrafterPlugin
from ..drafter.plugin_glue import RoundIndex
from ..drafter.plugin_weights import DrafterRing

MIN_COMMIT = 8
# commits of at most this bucket run in one graph with their round (a step's accepted tokens:
# at most 1 + num_speculative_tokens rows), saving a replay call per round
MERGE_COMMIT = 16
MAX_MODEL_LEN = 4096     # EngineArgs' default
STEP_TOKENS = 17         # 1 + EngineArgs' num_speculative_tokens default (8), with room
L_BUCKETS = (256, 512, 1024, 2048, 4096, 8192)
Fields = tuple[list[int], list[int], list[int], list[int]]


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class DrafterRunner:
    """Runs `DrafterPlugin.commit` + `propose` over padded static buffers, through CUDA graphs.

    num_slots: streams with drafter state at once (ring slots); depth: passes per round;
    use_graphs: capture CUDA graphs (needs a CUDA model); max_commit: the largest commit
    bucket (rows); None: next power of two of 16 per slot; length_buckets: the ring lengths
    a round may attend below R; max_model_len: tokens per stream (the engine's), so positions
    < max_positions = max_model_len + depth * B: the RoPE table's rows (`step` raises
    ValueError naming max_model_len for a position beyond); step_tokens: most tokens of one
    stream a target pass writes into the taps history at once (1 + num_speculative_tokens;
    longer passes keep only their last context_window + 1 rows: `history_rows`).
    Memory of the history: about (num_slots + 1) * (context_window + step_tokens) * n_taps *
    Ht * 2 bytes (mini engine, 8 slots: 27 MB).
    """

    def __init__(self, model: DrafterPlugin, depth: int, num_slots: int,
                 use_graphs: bool = True, max_commit: int | None = None,
                 length_buckets: tuple[int, ...] = L_BUCKETS, max_model_len: int = MAX_MODEL_LEN,
                 step_tokens: int = STEP_TOKENS):
        if depth < 1:
            raise ValueError(f"depth: must be >= 1, got {depth}")
        if max_model_len < 1:
            raise ValueError(f"max_model_len: must be >= 1, got {max_model_len}")
        if step_tokens < 1:
            raise ValueError(f"step_tokens: must be >= 1, got {step_tokens}")
        if use_graphs and model.device.type != "cuda":
            raise ValueError(f"use_graphs: CUDA graphs need a CUDA model, got {model.device}")
        c, dev = model.config, model.device
        self.model, self.depth, self.use_graphs = model, depth, use_graphs
        self.length_buckets = tuple(sorted(length_buckets))
        self.ring = DrafterRing.allocate(c, num_slots, depth, dev)
        self.max_s = _pow2(num_slots)
        self.max_commit = mc = max(MIN_COMMIT, _pow2(max_commit or 16 * self.max_s))
        self.max_positions = max_model_len + depth * c.block_size
        self.rope = model.rope_table(self.max_positions)     # kept: the graphs read it
        self.history_rows = c.context_window + step_tokens        # W, per ring slot
        # after the slots' rows: spare rows, one per token of a padded target step at most
        self.spare = num_slots * self.history_rows
        spare_rows = max(self.history_rows, _pow2(num_slots) * _pow2(step_tokens))
        self.history = torch.zeros(self.spare + spare_rows, c.num_taps,
                                   c.target_hidden_size, dtype=torch.bfloat16, device=dev)
        cols = mc + depth * self.max_s * c.block_size
        self.idx = torch.zeros(6, cols, dtype=torch.long, device=dev)
        self.c_idx, self.r_idx = self.idx[:, :mc], self.idx[:, mc:]
        cuda = dev.type == "cuda"
        self.stage = torch.zeros(6, cols, dtype=torch.long, pin_memory=True) if cuda else self.idx
        self.stage_np = self.stage.numpy()
        trash = self.ring.trash
        self.pad_commit = np.array([[0], [trash], [-1], [0]], dtype=np.int64)
        self.pad_round = np.array([[0], [trash], [0], [0]], dtype=np.int64)
        # pass r, block row j: offset r*B + j from the anchor
        self.offsets = np.arange(depth * c.block_size, dtype=np.int64).reshape(depth, 1, -1)
        self.host_drafts = (torch.zeros(self.max_s, depth * c.block_size, dtype=torch.long,
                                        pin_memory=True) if cuda else None)
        # every round's drafts, also at one fixed address (row s: stream s's depth*B ids), so
        # that the target's graphs can read them (`PluginRunner.use_draft_source`)
        self.drafts_out = torch.zeros(self.max_s * depth * c.block_size, dtype=torch.long,
                                      device=dev)
        self.uploaded = torch.cuda.Event() if cuda else None    # the last index upload done
        self.copied = torch.cuda.Event() if cuda else None      # the last drafts copy done
        self.graphs: dict[tuple, tuple] = {}
        self.used: set[tuple] = set()     # bucket keys run so far (graphs or eager)
        self.last_key: tuple | None = None      # the last commit or round bucket run
        self.last_graph: tuple | None = None    # the last graph key run (a merged one: "step")
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None

    @property
    def num_slots(self) -> int:
        return self.ring.trash

    # ---- the taps history ---------------------------------------------------------------
    def history_row(self, slot: int, position: int) -> int:
        """The history row of `position` of the stream in ring slot `slot`."""
        return slot * self.history_rows + position % self.history_rows

    def history_dst(self, slot: int | None, start: int, n: int) -> list[int]:
        """History rows for a target pass's taps of positions start .. start + n - 1 of the
        stream in `slot` (None: a stream without drafter state): -1 for rows not kept (all
        without a slot; else those more than context_window + 1 behind the last position, so
        that no two rows of one pass meet in the ring)."""
        if slot is None:
            return [-1] * n
        keep = self.model.config.context_window + 1
        w, base = self.history_rows, slot * self.history_rows
        skip = max(0, n - keep)
        return [-1] * skip + [base + q % w for q in range(start + skip, start + n)]

    def share_history(self, history: torch.Tensor) -> None:
        """Use `history` (another runner's, of the same shape, dtype and device: a target
        runner writes into it) as this runner's taps history. Raises ValueError on a mismatch
        or once a graph has been captured (graphs read the history's address)."""
        if self.graphs:
            raise ValueError("share_history: graphs are captured already")
        h = self.history
        if (history.shape, history.dtype, history.device) != (h.shape, h.dtype, h.device):
            raise ValueError(f"history: {h.dtype} {tuple(h.shape)} on {h.device} needed, got "
                             f"{history.dtype} {tuple(history.shape)} on {history.device}")
        self.history = history

    @torch.no_grad()
    def write_history(self, slot: int, start: int, taps: torch.Tensor) -> None:
        """Write taps bf16 [n, n_taps, Ht] of positions start .. start + n - 1 of the stream in
        `slot` into the history (its last context_window + 1 rows: at most two slice copies,
        on the current stream)."""
        keep = self.model.config.context_window + 1
        if taps.shape[0] > keep:
            start, taps = start + taps.shape[0] - keep, taps[-keep:]
        w, base, done = self.history_rows, slot * self.history_rows, 0
        while done < taps.shape[0]:
            a = (start + done) % w
            m = min(taps.shape[0] - done, w - a)
            self.history[base + a:base + a + m].copy_(taps[done:done + m])
            done += m

    # ---- buckets -------------------------------------------------------------------------
    def length_bucket(self, max_anchor: int) -> int:
        """Ring rows a round attends: every position it touches is < max_anchor + depth*B."""
        end, r = max_anchor + self.depth * self.model.config.block_size, self.ring.size
        for length in self.length_buckets:
            if end <= length < r:
                return length
        return r

    def round_buckets(self) -> list[tuple[int, int]]:
        r = self.ring.size
        lengths = [n for n in self.length_buckets if n < r] + [r]
        out, s_b = [], 1
        while s_b <= self.max_s:
            out += [(s_b, n) for n in lengths]
            s_b *= 2
        return out

    def commit_buckets(self) -> list[int]:
        out, n = [], MIN_COMMIT
        while n <= self.max_commit:
            out.append(n)
            n *= 2
        return out

    # ---- a round -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, commit: Fields | None, rnd: Fields, logits: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Commit N context rows, then one round for S streams; nothing waits for the device.

        commit: (next ids, slots, positions, history rows), N ints each: commit row i is
        position positions[i] of the stream in ring slot slots[i], with next token next_ids[i]
        and the taps of `history` row history_rows[i] (`history_row`; None or empty lists: no
        commit); rnd: (next ids, slots, anchors, history rows), S ints each; the history rows
        must hold those positions' taps (written before, on the stream the round runs on).
        Returns drafts int64
        [S, depth*B] (target ids) and, with logits, fp32 logits [S, depth*B, Vd] (else None)
        on the device (views of static outputs under graphs: valid until the next step).
        ValueError naming max_model_len when a position reaches max_positions (no RoPE row)."""
        n, s = len(commit[0]) if commit else 0, len(rnd[0])
        if s > self.max_s:
            raise ValueError(f"{s} streams in one round, the runner has {self.max_s} slots")
        top = max(max(rnd[2], default=-1) + self.depth * self.model.config.block_size - 1,
                  max(commit[2]) if n else -1)
        if top >= self.max_positions:
            raise ValueError(f"max_model_len: a round reaches position {top}, the runner's RoPE "
                             f"table holds positions < {self.max_positions} (max_model_len + "
                             f"depth * block_size)")
        if n > self.max_commit:       # in chunks of max_commit rows, each its own commit step
            mc = self.max_commit
            for a in range(0, n, mc):
                self._launch(tuple(f[a:a + mc] for f in commit), None)
            n = 0
        return self._launch(commit if n else None, rnd, logits)

    def _launch(self, commit: Fields | None, rnd: Fields | None, logits: bool = False):
        """Stage the indices, upload them, replay the commit and round steps."""
        if self.uploaded is not None:
            self.uploaded.synchronize()     # the stage's last upload is done (no-op in rounds)
        if commit is not None:
            n_b = max(MIN_COMMIT, _pow2(len(commit[0])))
            self._stage_commit(commit, n_b)
        if rnd is not None:
            s, s_b = len(rnd[0]), _pow2(len(rnd[0]))
            self._stage_round(rnd, s_b)
        if self.uploaded is not None:
            self.idx.copy_(self.stage, non_blocking=True)
            self.uploaded.record()
        if rnd is None:
            self._replay(("commit", n_b), lambda: self._commit_step(n_b))
            return None
        length = self.length_bucket(max(rnd[2]))
        if commit is not None and n_b <= MERGE_COMMIT:      # both steps in one replay
            drafts, out = self._replay(("step", n_b, s_b, length, logits),
                                       lambda: self._both_steps(n_b, s_b, length, logits),
                                       parts=(("commit", n_b), ("round", s_b, length, logits)))
        else:
            if commit is not None:
                self._replay(("commit", n_b), lambda: self._commit_step(n_b))
            drafts, out = self._replay(("round", s_b, length, logits),
                                       lambda: self._round_step(s_b, length, logits))
        return drafts[:s], None if out is None else out[:s]

    def _stage_commit(self, commit: Fields, n_b: int) -> None:
        """Commit fields (4 lists of n ints) into stage columns 0 .. n - 1 and padding into
        n .. n_b - 1 (stale values of an earlier, larger step go), then rows 4, 5: the ring
        rows (position % R, as `torch.remainder`) and the RoPE table rows (padding's -1: 0)."""
        st, n = self.stage_np[:, :n_b], len(commit[0])
        st[:4, :n] = commit
        st[:4, n:] = self.pad_commit
        np.remainder(st[2], self.ring.size, out=st[4])
        np.maximum(st[2], 0, out=st[5])

    def _stage_round(self, rnd: Fields, s_b: int) -> None:
        """Round fields (4 lists of s ints) into the round's stage columns 0 .. s - 1 and
        padding (anchor 0, the trash slot) into s .. s_b - 1; then, from the anchors p, row 2
        as [depth, s_b]: pass r's anchors p + r*B, rows 4, 5 as [depth, s_b, B]: the block
        rows' positions p + r*B + j and their ring rows."""
        st, s = self.stage_np[:, self.max_commit:], len(rnd[0])
        st[:4, :s] = rnd
        st[:4, s:s_b] = self.pad_round
        pos = st[2, :s_b][:, None] + self.offsets                     # [depth, s_b, B]
        n = pos.size
        st[4, :n] = pos.reshape(-1)
        np.remainder(st[4, :n], self.ring.size, out=st[5, :n])
        st[2, :self.depth * s_b] = pos[:, :, 0].reshape(-1)

    def _commit_step(self, n_b: int):
        """The graphed commit of bucket n_b: the RoPE rows gathered, then `DrafterPlugin.commit`
        over the staged indices (`_stage_commit`), its taps read from the history by row."""
        i = self.c_idx
        rope = self.rope.index_select(0, i[5, :n_b])                  # [N_b, 2, 2, D/2]
        self.model.commit(self.ring, self.history, i[0, :n_b], i[1, :n_b], i[2, :n_b],
                          i[4, :n_b], rope, taps_rows=i[3, :n_b])
        return None

    def _both_steps(self, n_b: int, s_b: int, length: int, logits: bool = False):
        """The commit of bucket n_b, then the round of bucket (s_b, length): one graph."""
        self._commit_step(n_b)
        return self._round_step(s_b, length, logits)

    def _round_step(self, s_b: int, length: int, logits: bool = False):
        """The graphed round of bucket (s_b, length): every pass's RoPE rows gathered (one
        index_select), then `DrafterPlugin.propose` over the staged indices (`_stage_round`),
        its taps read from the history by row. Returns its (drafts, logits or None); the
        drafts also go into `drafts_out`."""
        i, d, b = self.r_idx, self.depth, self.model.config.block_size
        n = d * s_b * b
        rope = self.rope.index_select(0, i[4, :n]).view(d, s_b * b, *self.rope.shape[1:])
        index = RoundIndex(i[2, :d * s_b].view(d, s_b), i[4, :n].view(d, s_b, b),
                           i[5, :n].view(d, s_b, b), rope)
        drafts, out = self.model.propose(self.ring, self.history, i[0, :s_b], i[1, :s_b], index,
                                         length, logits, taps_rows=i[3, :s_b])
        self.drafts_out[:drafts.numel()].view_as(drafts).copy_(drafts)
        return drafts, out

    @torch.no_grad()
    def read_drafts(self, drafts: torch.Tensor) -> list[list[int]]:
        """drafts int64 [S, depth*B] on the device (`step`) -> S lists of ints. On CUDA: one
        non-blocking copy into pinned memory and one event wait (the round's only sync)."""
        return self.finish_read(self.start_read(drafts))

    @torch.no_grad()
    def start_read(self, drafts: torch.Tensor) -> torch.Tensor:
        """Enqueue the copy of drafts int64 [S, depth*B] to the host (CUDA: into pinned memory,
        on the current stream, then an event); returns what `finish_read` takes."""
        if self.copied is None:
            return drafts
        host = self.host_drafts[:drafts.shape[0]]
        host.copy_(drafts, non_blocking=True)
        self.copied.record()
        return host

    def finish_read(self, host: torch.Tensor) -> list[list[int]]:
        """Wait for `start_read`'s copy (CUDA: one event wait) -> S lists of ints."""
        if self.copied is not None:
            self.copied.synchronize()
        return host.tolist()

    # ---- graphs --------------------------------------------------------------------------
    def _replay(self, key: tuple, fn, parts: tuple[tuple, ...] = ()):
        """Run bucket `key` (its graph, captured on first use, or fn eagerly); parts: the
        commit and round keys a merged ("step", ...) key runs, recorded in `used` as well
        (`last_key`: the round's)."""
        self.used.update((key, *parts))
        self.last_key = parts[-1] if parts else key
        self.last_graph = key
        if not self.use_graphs:
            return fn()
        if key not in self.graphs:
            self.graphs[key] = self._capture(fn)
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def _capture(self, fn):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()   # compiles kernels; writes what the replay writes again
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out

    @torch.no_grad()
    def capture_all(self) -> int:
        """Capture every commit and round bucket now and replay each once (its upload; all-
        padding steps: only the trash slot is written; rounds without logits, as serving runs
        them). Returns the number of graphs captured. ValueError without use_graphs."""
        if not self.use_graphs:
            raise ValueError("use_graphs: capture_all needs CUDA graphs on")
        self.uploaded.synchronize()
        none: Fields = ([], [], [], [])
        self._stage_commit(none, self.max_commit)
        self._stage_round(none, self.max_s)
        self.idx.copy_(self.stage)
        todo = {("commit", n_b): (lambda n=n_b: self._commit_step(n))
                for n_b in self.commit_buckets()}
        merged = [n for n in self.commit_buckets() if n <= MERGE_COMMIT]
        for s_b, length in self.round_buckets():
            todo[("round", s_b, length, False)] = lambda s=s_b, n=length: self._round_step(s, n)
            for n_b in merged:
                todo[("step", n_b, s_b, length, False)] = \
                    lambda c=n_b, s=s_b, n=length: self._both_steps(c, s, n)
        count = 0
        for key, fn in todo.items():
            if key not in self.graphs:
                self.graphs[key] = self._capture(fn)
                self.graphs[key][0].replay()      # uploaded now, not at its first launch
                count += 1
        return count

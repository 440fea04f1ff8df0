"""`PluginRunner`: runs `PluginModel` steps, decode and verification steps through CUDA graphs.

A step whose streams each bring at most `max_q_len` tokens (1 + draft tokens) and whose rows
all need logits is a graph step. It is padded to a bucket: S real streams -> S_b (next power of
two), T tokens -> T_b (S_b times the next power of two, at most S_b·max_q_len). The
bucket's graph is captured at start-up (`capture_all`, all-padding steps) or on first use
(after one eager warm-up run, which compiles the Triton kernels and writes the same K/V the
replay writes again) and replayed from then on. Padding:
the T_b - T extra tokens go to extra streams of at most max_q_len tokens each, positions 0..,
block tables of zeros (they only read block 0) and slot -1 (nothing written); the rest of the
S_b + ceil(T_b / max_q_len) stream slots are empty. Every row is owned by a stream, so every
value stays finite, and the kernels give a real row the same bits whatever the padding
(`plugins/LAYOUTS.md` §Batch invariance). Other steps (prefill chunks, scoring) run eagerly
with their own bounds (same bits). On CPU, or with graphs off, bucketed steps run the same
padded inputs eagerly. A step's padded metadata is written into a pinned host mirror of the
graphs' input buffers and sent in one non-blocking copy (each pageable `copy_` would wait for
the GPU). Source of the technique: vLLM / TensorRT-LLM CUDA-graph batch buckets.

Tensor parallelism: every rank runs its own `PluginRunner` over its shard and sees the same
step metadata, so all ranks take the same bucket and warm up, capture and replay together; the
model's NCCL all_reduce calls are captured into the graphs (the warm-up before each capture
runs them eagerly first, which also creates the NCCL communicator). A capture that fails on a
tensor-parallel model raises a RuntimeError that names `enforce_eager=True`, the way to run
without graphs; there is no silent fallback. On 2xH200 such a capture did not finish, so
`LLM(..., tensor_parallel_size > 1, device="cuda")` requires enforce_eager=True for now, or
tp_cuda_graphs=True to try graphs (experimental; captures then use capture_error_mode
"thread_local").
"""

from __future__ import annotations

import numpy as np
import torch

from ..model.metadata import StepMetadata
from ..model.plugin_model import PluginModel

_FIELDS = ("input_ids", "positions", "full_slots", "sliding_slots")


class PluginRunner:
    """Drop-in for `ModelRunner.forward` on the kernel path.

    max_num_seqs: streams per step; max_model_len: bound of seq_lens (tokens); max_q_len:
    tokens per stream in a graph step (1 + num_speculative_tokens); block_size: tokens per
    cache block; use_graphs: capture CUDA graphs (needs a CUDA model).
    """

    def __init__(self, model: PluginModel, caches: list[dict[str, torch.Tensor]],
                 max_num_seqs: int, max_model_len: int, max_q_len: int, block_size: int,
                 use_graphs: bool = True):
        if use_graphs and model.device.type != "cuda":
            raise ValueError(f"use_graphs: CUDA graphs need a CUDA model, got {model.device}")
        self.model, self.caches, self.use_graphs = model, caches, use_graphs
        self.max_seq_len, self.max_q_len = max_model_len, max_q_len
        self.max_s = _pow2(max_num_seqs)
        self.max_t = self.max_s * _pow2(max_q_len)
        self.width = -(-max_model_len // block_size)
        n = self.max_s + -(-self.max_t // max_q_len)
        # input_ids has one element past every bucket: the trash target of unused draft_dst
        shapes = {"input_ids": ((self.max_t + 1,), torch.long),
                  "positions": ((self.max_t,), torch.long),
                  "full_slots": ((self.max_t,), torch.long),
                  "sliding_slots": ((self.max_t,), torch.long),
                  "cu_q_lens": ((n + 1,), torch.int32), "seq_lens": ((n,), torch.int32),
                  "full_block_tables": ((n, self.width), torch.int32),
                  "sliding_block_tables": ((n, self.width), torch.int32),
                  "draft_dst": ((self.max_t,), torch.long),
                  "draft_src": ((self.max_t,), torch.long),
                  "taps_dst": ((self.max_t,), torch.long)}
        # the graphs' inputs: views of one device byte buffer, written by one copy per step
        # from a pinned host mirror (CUDA) or in place (CPU)
        self._dev_bytes, self.static = _byte_views(shapes, model.device)
        if model.device.type == "cuda":
            self._host_bytes, self._host = _byte_views(shapes, "cpu", pin=True)
            self._copied = torch.cuda.Event()
        else:
            self._host_bytes, self._host, self._copied = self._dev_bytes, self.static, None
        for name in ("full_slots", "sliding_slots"):
            self._host[name].fill_(-1)
        self._host["draft_dst"].fill_(self.max_t)
        self._np = {name: v.numpy() for name, v in self._host.items()}  # the mirror, as numpy
        self._upload()
        self.graphs: dict[tuple[int, int, tuple[int, ...]], tuple] = {}
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.draft_source: torch.Tensor | None = None   # `use_draft_source`
        self._draft_k = 0                                # draft_dst entries the last step set
        self.taps_sink: torch.Tensor | None = None      # `use_taps_sink`
        self._sink_trash = np.zeros(0, dtype=np.int64)  # its spare rows, one per token
        # int64 [>= T] on the device: the last step's input ids as the model read them (the
        # drafts put in); the engine's chained drafter round reads them
        self.last_input_ids: torch.Tensor | None = None

    def use_taps_sink(self, sink: torch.Tensor, trash: int) -> None:
        """Steps given `taps_dst` write their taps into `sink` (bf16 [N, n_taps, H] on the
        model's device, at a fixed address: `DrafterRunner.history`) themselves, inside the
        step (in the graph: one index_copy), instead of returning them: row i of the step goes
        to sink row taps_dst[i] (-1: nowhere; in the graph, padding and -1 rows go to the
        spare rows trash .. trash + max_t - 1). A bucketed step then needs no copy of its
        taps. Raises ValueError for a wrong dtype or device, too few spare rows, or once a
        graph has been captured."""
        if self.graphs:
            raise ValueError("use_taps_sink: graphs are captured already")
        if sink.dtype != torch.bfloat16 or sink.dim() != 3 or sink.device != self.model.device:
            raise ValueError(f"sink: bf16 [N, n_taps, H] on {self.model.device}, got "
                             f"{sink.dtype} {tuple(sink.shape)} on {sink.device}")
        if not 0 <= trash <= sink.shape[0] - self.max_t:
            raise ValueError(f"trash: rows {trash} .. {trash + self.max_t - 1} must lie in the "
                             f"sink's {sink.shape[0]} rows")
        self.taps_sink = sink
        self._sink_trash = np.arange(trash, trash + self.max_t, dtype=np.int64)
        self._np["taps_dst"][:] = self._sink_trash

    def use_draft_source(self, values: torch.Tensor) -> None:
        """Bucketed steps take their deferred drafts from `values` (int64 [N] on the model's
        device, at a fixed address: `DrafterRunner.drafts_out`) inside the step itself (in
        the graph), where otherwise two eager ops per step put them in; forward's draft_ids
        must then hold a view of `values` (from its start). Costs every bucketed step one
        gather and one scatter over max_num_seqs * max_q_len ids on the device.

        Raises ValueError for a wrong dtype or device, or once a graph has been captured."""
        if self.graphs:
            raise ValueError("use_draft_source: graphs are captured already")
        if values.dtype != torch.long or values.dim() != 1 or values.device != self.model.device:
            raise ValueError(f"values: int64 [N] on {self.model.device}, got {values.dtype} "
                             f"{tuple(values.shape)} on {values.device}")
        self.draft_source = values

    def bucket(self, meta: StepMetadata) -> tuple[int, int] | None:
        """(S_b, T_b) for a graph step, None for an eager one."""
        s, t = meta.num_seqs, meta.num_tokens
        if (max(meta.q_lens) > self.max_q_len or int(meta.logits_rows.shape[0]) != t
                or s > self.max_s):
            return None
        s_b = _pow2(s)
        t_b = s_b
        while t_b < t:
            t_b *= 2
        return s_b, min(t_b, s_b * _pow2(self.max_q_len))

    @torch.no_grad()
    def capture_all(self, tap_layers: tuple[int, ...] = ()) -> int:
        """Capture every bucket's graph now, as vLLM does at start-up, so that no request
        waits for a capture, and replay each once (a graph's first launch uploads it to the
        device, a cost per graph that short runs would otherwise pay inside their steps).
        Runs all-padding steps: nothing is written to the cache.
        Returns the number of graphs captured. Raises ValueError without use_graphs."""
        if not self.use_graphs:
            raise ValueError("use_graphs: capture_all needs CUDA graphs on")
        none = torch.zeros(0, dtype=torch.long)
        empty = StepMetadata(
            input_ids=none, positions=none, cu_q_lens=torch.zeros(1, dtype=torch.int32),
            seq_lens=torch.zeros(0, dtype=torch.int32),
            full_block_tables=torch.zeros(0, 0, dtype=torch.int32),
            sliding_block_tables=torch.zeros(0, 0, dtype=torch.int32), full_slots=none,
            sliding_slots=none, logits_rows=none, q_lens=(), seq_lens_host=())
        count, s_b = 0, 1
        while s_b <= self.max_s:
            t_b = s_b
            while t_b <= s_b * _pow2(self.max_q_len):
                key = (s_b, t_b, tuple(tap_layers))
                if key not in self.graphs:
                    self.graphs[key] = self._capture(self._fill(empty, s_b, t_b), tap_layers)
                    self.graphs[key][0].replay()   # uploads it now, not at its first step
                    count += 1
                t_b *= 2
            s_b *= 2
        return count

    @torch.no_grad()
    def forward(self, meta: StepMetadata, tap_layers: tuple[int, ...] = (),
                draft_ids: tuple[list[int], list[int], torch.Tensor] | None = None,
                taps_dst: list[int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 logits [R, V] for meta.logits_rows and taps [T, len(tap_layers), H] or None
        (the contract of `ModelRunner.forward`); meta may live on any device.
        draft_ids: (dst, src, values): token dst[i] of the step takes values[src[i]] (values:
        int64 [N] on the model's device, e.g. a drafter round's drafts, which the current
        stream must be ready to read) instead of meta.input_ids[dst[i]]; dst, src: host ints.
        taps_dst: T ints (with `use_taps_sink`): the taps go into the sink's rows taps_dst[i]
        (-1: nowhere) and None is returned for them. Raises ValueError for taps_dst without a
        sink or taps, or of the wrong length."""
        if taps_dst is not None and (self.taps_sink is None or not tap_layers
                                     or len(taps_dst) != meta.num_tokens):
            raise ValueError(f"taps_dst: needs use_taps_sink, tap_layers and one row per token "
                             f"({meta.num_tokens}), got {len(taps_dst)}")
        b = self.bucket(meta)
        if b is None:
            return self._forward_eager(meta, tap_layers, draft_ids, taps_dst)
        if (draft_ids and draft_ids[0] and self.draft_source is not None
                and draft_ids[2].data_ptr() != self.draft_source.data_ptr()):
            raise ValueError("draft_ids: values must be a view of the runner's draft source "
                             "(use_draft_source) from its start")
        padded = self._fill(meta, *b, draft_ids, taps_dst)
        self.last_input_ids = padded.input_ids
        key = (*b, tuple(tap_layers))
        if not self.use_graphs:
            logits, taps = self._run(padded, tap_layers)
        else:
            if key not in self.graphs:
                self.graphs[key] = self._capture(padded, tap_layers)
            graph, logits, taps = self.graphs[key]
            graph.replay()
        t = meta.num_tokens
        if taps_dst is not None or taps is None:
            return logits[:t].clone(), None
        return logits[:t].clone(), taps[:t].clone()

    def _forward_eager(self, meta: StepMetadata, tap_layers, draft_ids, taps_dst):
        """`forward` of a step outside the buckets, eagerly with its own bounds."""
        meta, dev = _to(meta, self.model.device), self.model.device
        if draft_ids and draft_ids[0]:
            dst, src, values = draft_ids
            _put_drafts(meta.input_ids, torch.tensor(dst, device=dev),
                        torch.tensor(src, device=dev), values)
        self.last_input_ids = meta.input_ids
        logits, taps = self.model.forward(meta, self.caches, max(meta.seq_lens_host),
                                          max(meta.q_lens), tap_layers=tap_layers)
        if taps_dst is None:
            return logits, taps
        keep = [i for i, d in enumerate(taps_dst) if d >= 0]
        if keep:
            rows = taps if len(keep) == len(taps_dst) else taps[torch.tensor(keep, device=dev)]
            self.taps_sink.index_copy_(0, torch.tensor([taps_dst[i] for i in keep], device=dev),
                                       rows)
        return logits, None

    def _run(self, padded: StepMetadata, tap_layers):
        st = self.static
        if self.draft_source is not None:      # all max_t entries; unused ones hit the trash id
            _put_drafts(st["input_ids"], st["draft_dst"], st["draft_src"], self.draft_source)
        logits, taps = self.model.forward(padded, self.caches, self.max_seq_len, self.max_q_len,
                                          all_rows=True, tap_layers=tap_layers)
        if self.taps_sink is not None and taps is not None:   # unused rows: spare rows
            self.taps_sink.index_copy_(0, st["taps_dst"][:taps.shape[0]], taps)
        return logits, taps

    def _capture(self, padded: StepMetadata, tap_layers):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._run(padded, tap_layers)  # compiles kernels; writes what the replay rewrites
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # under TP, other threads (the NCCL watchdog) query events during the long capture of
        # a whole step; "thread_local" confines the capture's rules to this thread
        # (pytorch/pytorch#104555)
        mode = "global" if self.model.all_reduce is None else "thread_local"
        try:
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode=mode):
                logits, taps = self._run(padded, tap_layers)
        except Exception as exc:
            if self.model.all_reduce is None:
                raise
            raise RuntimeError(f"CUDA graph capture of a tensor-parallel step ({padded.num_tokens}"
                               f"-token bucket, all_reduce captured in the graph) failed: "
                               f"{exc}. Run with enforce_eager=True (no CUDA graphs on any "
                               "rank)") from exc
        return graph, logits, taps

    def _upload(self) -> None:
        """The host mirror into the graphs' input buffer: one non-blocking copy (CUDA); the
        event lets the next `_fill` wait until the copy has read the mirror."""
        if self._copied is not None:
            self._dev_bytes.copy_(self._host_bytes, non_blocking=True)
            self._copied.record()

    def _fill(self, meta: StepMetadata, s_b: int, t_b: int, draft_ids=None,
              taps_dst: list[int] | None = None) -> StepMetadata:
        """Copy the step into the static buffers, padded to (s_b, t_b); returns views of them
        (`self.static`). Written on the host mirror, then uploaded in one copy; draft_ids
        (`forward`'s): their indices ride in the same copy, then two ops put the values in
        (inside the step, `_run`, with a draft source); so do taps_dst (else spare rows)."""
        if self._copied is not None:
            self._copied.synchronize()        # the previous upload has read the mirror
        lens = self._fill_host(meta, s_b, t_b)
        if self.taps_sink is not None:
            dst = self._np["taps_dst"]
            dst[:t_b] = self._sink_trash[:t_b]
            if taps_dst is not None:
                got = np.asarray(taps_dst, dtype=np.int64)
                np.copyto(dst[:len(got)], got, where=got >= 0)
        k = len(draft_ids[0]) if draft_ids else 0
        if k:
            self._np["draft_dst"][:k] = draft_ids[0]
            self._np["draft_src"][:k] = draft_ids[1]
        if self._draft_k > k:                  # the last step's extra entries: back to trash
            self._np["draft_dst"][k:self._draft_k] = self.max_t
            self._np["draft_src"][k:self._draft_k] = 0
        self._draft_k = k
        self._upload()
        st, s, n = self.static, meta.num_seqs, len(lens)
        if k and self.draft_source is None:
            _put_drafts(st["input_ids"], st["draft_dst"][:k], st["draft_src"][:k], draft_ids[2])
        return StepMetadata(
            input_ids=st["input_ids"][:t_b], positions=st["positions"][:t_b],
            cu_q_lens=st["cu_q_lens"][:n + 1], seq_lens=st["seq_lens"][:n],
            full_block_tables=st["full_block_tables"][:n],
            sliding_block_tables=st["sliding_block_tables"][:n],
            full_slots=st["full_slots"][:t_b], sliding_slots=st["sliding_slots"][:t_b],
            logits_rows=st["input_ids"][:0], q_lens=tuple(lens),
            seq_lens_host=tuple(meta.seq_lens_host) + tuple(lens[s:]))

    def _fill_host(self, meta: StepMetadata, s_b: int, t_b: int) -> list[int]:
        """Write the padded step into the host mirror (`_fill`'s layout; module docstring);
        returns the n stream slots' token counts (real, padding, then empty). Numpy on views
        of the mirror: a few µs per op where torch's small CPU ops cost several (H200 host:
        63 µs per step with torch ops, bench/results/h200-2026-11-30d/m_launch_costs.log)."""
        st, t, s, q = self._np, meta.num_tokens, meta.num_seqs, self.max_q_len
        n = s_b + -(-t_b // q)
        for name in _FIELDS:
            st[name][:t] = _numpy(getattr(meta, name))
        st["input_ids"][t:t_b] = 0
        st["full_slots"][t:t_b] = -1
        st["sliding_slots"][t:t_b] = -1
        pad_lens = [min(q, t_b - t - q * j) for j in range(-(-(t_b - t) // q))]
        if pad_lens:
            st["positions"][t:t_b] = np.concatenate([np.arange(m) for m in pad_lens])
        lens = list(meta.q_lens) + pad_lens + [0] * (n - s - len(pad_lens))
        st["cu_q_lens"][0] = 0
        st["cu_q_lens"][1:n + 1] = np.cumsum(lens)
        st["seq_lens"][:s] = _numpy(meta.seq_lens)
        st["seq_lens"][s:n] = lens[s:]
        for name in ("full_block_tables", "sliding_block_tables"):
            src = _numpy(getattr(meta, name))
            st[name][:n] = 0
            st[name][:s, :src.shape[1]] = src
        return lens


def _byte_views(shapes: dict, device, pin: bool = False
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One zeroed uint8 buffer on `device` (pinned host memory if pin) and a typed view of it
    per name: shapes {name: (shape, dtype)}; each view starts 8-byte aligned."""
    offsets, size = {}, 0
    for name, (shape, dtype) in shapes.items():
        offsets[name] = size
        nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        size += -(-nbytes // 8) * 8
    buf = torch.zeros(size, dtype=torch.uint8, device=device, pin_memory=pin)
    views = {}
    for name, (shape, dtype) in shapes.items():
        nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        views[name] = buf[offsets[name]:offsets[name] + nbytes].view(dtype).view(shape)
    return buf, views


def _put_drafts(input_ids: torch.Tensor, dst: torch.Tensor, src: torch.Tensor,
                values: torch.Tensor) -> None:
    """input_ids[dst[i]] = values[src[i]] on the device (`PluginRunner.forward`'s draft_ids;
    dst, src: int64 index tensors there)."""
    input_ids.index_copy_(0, dst, values.index_select(0, src))


def _numpy(x: torch.Tensor) -> np.ndarray:
    """A CPU tensor's numpy view (a device tensor is copied to the host first)."""
    return x.numpy() if x.device.type == "cpu" else x.cpu().numpy()


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _to(meta: StepMetadata, device: torch.device) -> StepMetadata:
    """The same metadata with its tensors on `device` (host tuples unchanged)."""
    fields = {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
              for k, v in meta.__dict__.items()}
    return StepMetadata(**fields)

"""`LLMEngine`: requests in, one batched step at a time, tokens and text deltas out.

A step schedules streams (continuous batching), runs one forward pass over all of them,
samples with the position-keyed sampler and commits tokens through each request's
`OutputProcessor`. Front ends (`LLM`, the CLI, servers) drive `step()` in a loop.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import torch

from ..engine_format import TARGET_DIR
from ..sampling import SamplingParams
from ..spec.drafter_proposer import DrafterProposer
from ..spec.metrics import SpecMetrics
from ..spec.plugin_drafter_proposer import DeferredDrafts, PluginDrafterProposer
from ..spec.speculator import MODES as SPECULATIVE_MODES
from ..spec.speculator import Speculator
from ..spec.verify import Verdict
from ..tokenizer import KolibriTokenizer
from .batch import build_metadata
from .cpu_affinity import apply as apply_cpu_affinity
from .cuda_graphs import PluginRunner
from .engine_args import ACCEPTANCE_METHODS, MODEL_IMPLS, EngineArgs  # noqa: F401 (re-exported)
from .engine_loader import Manifest, load_drafter, load_target
from .kv_cache import KVCache, plan_cache  # noqa: F401 (plan_cache re-exported)
from .model_runner import ModelRunner
from .output import OutputProcessor, RequestOutput, StepOutput
from .plugin_loader import load_plugin_target
from .scheduler import BlockManager, ScheduledSeq, Scheduler
from .sequence import Sequence
from .step_drafts import chain_items, deferred_slots, taps_dst
from .step_verification import TokenReader, verify_step


CHAIN_AFTER_COPY = True   # chained rounds after copy-drafted steps too (`chain_items`)


def _check_device(device: str | torch.device) -> torch.device:
    """"cpu" or a CUDA device that exists; ValueError naming `device` otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {device!r} is not a torch device ({e})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} but torch sees no CUDA device")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: must be 'cpu' or 'cuda[:N]', got {device!r}")
    return dev


class LLMEngine:
    """Owns the model, the cache, the scheduler and the requests."""

    def __init__(self, engine_dir: str | Path, speculative: str = "copy+drafter",
                 args: EngineArgs | None = None, device: str = "cpu"):
        if speculative not in SPECULATIVE_MODES:
            raise ValueError(f"speculative: must be one of {list(SPECULATIVE_MODES)}, "
                             f"got {speculative!r}")
        self.args = args or EngineArgs()
        self.device = _check_device(device)
        self.cpus = apply_cpu_affinity(self.args.cpu_affinity, self.device)   # None: as it was
        self.manifest = Manifest.read(engine_dir)
        target = self._load_target(Path(engine_dir))
        self.tokenizer = KolibriTokenizer.from_pretrained(Path(engine_dir) / TARGET_DIR)
        self.scheduler = Scheduler(BlockManager(self.cache.geometry), self.args.max_num_seqs,
                                   self.args.max_num_batched_tokens)
        self.requests: dict[str, tuple[Sequence, OutputProcessor, RequestOutput]] = {}
        self._ids = itertools.count()
        proposer = self._load_proposer(Path(engine_dir), target) if "drafter" in speculative \
            else None
        overlap = self.args.drafter_overlap
        if overlap is None:
            overlap = isinstance(proposer, PluginDrafterProposer) and self.device.type == "cuda"
        defer = self.args.drafts_on_device
        if defer is None:
            defer = overlap and isinstance(self.runner, PluginRunner)   # TP wraps the runner
        elif defer and not isinstance(self.runner, PluginRunner):
            raise ValueError("drafts_on_device: needs the kernel path on one device "
                             "(model_impl='plugins', no tensor parallelism)")
        chain = self.args.drafter_chain
        if chain is None:
            chain = defer and overlap and isinstance(proposer, PluginDrafterProposer)
        self.speculator = Speculator(speculative, proposer, self.args.num_speculative_tokens,
                                     gate=self.args.drafter_gate, overlap=overlap, defer=defer,
                                     chain=chain, coupled=self.args.draft_sampling == "coupled")
        if self.speculator.chain_rounds:   # graphs: the input ids where the target's keep them
            proposer.enable_chain(self.args.num_speculative_tokens, self.runner.max_t,
                                  self.runner.static["input_ids"] if self.runner.use_graphs
                                  else None)
        self._reader = TokenReader()
        if self.speculator.defer:       # the target's graphs put the drafts in themselves
            self.runner.use_draft_source(proposer.runner.drafts_out)
        if isinstance(proposer, PluginDrafterProposer) and isinstance(self.runner, PluginRunner):
            h = proposer.runner       # the target's passes write the drafter's taps history
            self.runner.use_taps_sink(h.history, h.spare)
        self.tap_layers = proposer.drafter.config.target_layer_ids if proposer else ()
        self.stats = SpecMetrics()
        self.chain_after_copy = CHAIN_AFTER_COPY   # `step_drafts.chain_items` (benches flip it)
        self._step_mark: float | None = None     # end of the last timed step (perf_counter)
        if isinstance(self.runner, PluginRunner) and self.runner.use_graphs:
            self.runner.capture_all(self.tap_layers)
            if isinstance(proposer, PluginDrafterProposer):
                proposer.capture_all()

    def _load_proposer(self, engine_dir: Path, target):
        """The block drafter as a proposer: its kernel path (`PluginDrafterProposer`, CUDA
        graphs on CUDA) next to the target's kernel path, else the reference modules."""
        if self.model_impl == "plugins":
            return PluginDrafterProposer.load(
                engine_dir, self.manifest, target, self.device, self.args.drafter_depth,
                self.args.max_num_seqs,
                use_graphs=self.device.type == "cuda" and not self.args.enforce_eager,
                attn=self.args.drafter_attention, max_model_len=self.args.max_model_len,
                step_tokens=1 + self.args.num_speculative_tokens,
                keyed=self.args.draft_sampling == "coupled")
        drafter = load_drafter(engine_dir, self.manifest, target, self.device)
        depth = self.args.drafter_depth or drafter.config.serving_defaults.depth
        return DrafterProposer(drafter, depth)

    # Tensor-parallel hook: `tp_worker.TPLLMEngine` overrides this (rank 0's shard, a per-rank
    # cache, a runner that hands each step to the other ranks); keep name and contract.
    def _load_target(self, engine_dir: Path):
        """Load the target (reference modules or the kernel path), the cache and the runner;
        returns what the drafter borrows from the target."""
        args, impl = self.args, self.args.model_impl
        if impl == "auto":
            impl = "plugins" if self.device.type == "cuda" else "reference"
        if impl == "reference":
            for name in ("lm_head_kernel", "attention_linear_kernel"):
                if getattr(args, name) not in ("mma", "auto"):
                    raise ValueError(f"{name}: {getattr(args, name)!r} is a kernel of "
                                     f"model_impl 'plugins', this engine runs 'reference'")
            model, rotations, scales = load_target(engine_dir, self.manifest, self.device)
            target = model
        else:
            model, target, scales = load_plugin_target(engine_dir, self.manifest, self.device)
            model.head = model.head.with_kernel(args.lm_head_kernel)
            model.use_linear_kernel(args.attention_linear_kernel)
        self.config, self.model_impl = model.config, impl
        geometry = plan_cache(self.config, self.manifest.kv, args, args.max_num_batched_tokens)
        self.cache = KVCache(self.config, self.manifest.kv, geometry, scales, self.device)
        if impl == "reference":
            self.runner = ModelRunner(model, self.cache, rotations)
        else:
            self.runner = PluginRunner(model, self.cache.layers, args.max_num_seqs,
                                       args.max_model_len, 1 + args.num_speculative_tokens,
                                       args.block_size, use_graphs=self.device.type == "cuda"
                                       and not args.enforce_eager)
        return target

    def add_request(self, prompt: str | list[int], params: SamplingParams,
                    request_id: str | None = None) -> str:
        """Queue a request (text, or token ids used as they are). Returns its id.

        Raises:
            ValueError: empty prompt, token id out of range, prompt not shorter than
                max_model_len, or a request id already in use.
        """
        text = prompt if isinstance(prompt, str) else None
        ids = self.check_request(prompt)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise ValueError(f"request_id: {rid!r} is already in use")
        seq = Sequence(rid, ids, params)
        max_new = min(params.max_tokens, self.args.max_model_len - len(ids))
        proc = OutputProcessor(self.tokenizer, params, self.config.eos_token_ids, max_new)
        out = RequestOutput(rid, text, ids)
        out.metrics.num_prompt_tokens = len(ids)
        self.requests[rid] = (seq, proc, out)
        self.speculator.add(rid, ids, params)
        self.scheduler.add(seq)
        return rid

    def check_request(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids (text gets BOS), checked; raises ValueError naming `prompt`.
        Safe to call from any thread: it reads only the tokenizer and the config."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_bos=True)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        else:
            raise ValueError("prompt: must be a string or a list of token ids")
        self._check_prompt(ids)
        return ids

    def usage(self) -> dict[str, int]:
        """Requests running and waiting, and full-layer KV blocks used / total (for metrics)."""
        blocks = self.scheduler.blocks
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "kv_blocks_used": blocks.num_used_full,
                "kv_blocks_total": blocks.geometry.num_full_blocks}

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt: must hold at least one token")
        if any(not 0 <= int(t) < self.config.vocab_size for t in ids):
            raise ValueError(f"prompt: token ids must be in [0, {self.config.vocab_size})")
        if len(ids) >= self.args.max_model_len:
            raise ValueError(f"prompt: {len(ids)} tokens, max_model_len is "
                             f"{self.args.max_model_len}")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[StepOutput]:
        """One batched target pass: propose drafts, verify every stream's drafts together,
        commit what was accepted. Returns the requests that committed tokens."""
        drafts = self._propose()
        deferred = self.speculator.take_deferred()
        scheduled = self.scheduler.schedule({rid: len(d[0]) for rid, d in drafts.items()})
        if not scheduled:
            self._step_mark = None
            return []
        extra = {it.seq.request_id: drafts[it.seq.request_id][0] for it in scheduled
                 if it.samples and it.seq.request_id in drafts}
        g = self.cache.geometry
        meta = build_metadata(scheduled, g.block_size, g.ring_blocks, extra)
        dst = self._taps_dst(scheduled, extra)
        sink = {} if dst is None else {"taps_dst": dst}
        on_device = None
        if deferred is None:
            logits, taps = self.runner.forward(meta, self.tap_layers, **sink)
        else:
            logits, taps, on_device = self._forward_deferred(meta, scheduled, extra, deferred,
                                                             sink)
        chain = chain_items(scheduled, extra, drafts, self.chain_after_copy) \
            if self.speculator.chain_rounds else None
        verdicts = self._verify_all([it.seq for it in scheduled if it.samples], logits, extra,
                                    on_device, chain)
        outputs = []
        firsts = itertools.accumulate(meta.q_lens, initial=0)
        for item, first in zip(scheduled, firsts):
            seq, rid = item.seq, item.seq.request_id
            seq.num_computed += item.num_tokens
            if not item.samples:
                self._observe(seq, item.start, taps, first, item.num_tokens, [], dst)
                continue
            d, sources = extra.get(rid, []), drafts.get(rid, ([], []))[1]
            verdict = verdicts[rid]
            step = self._commit(seq, verdict.tokens)
            self._record(step, sources[:len(d)], verdict.num_accepted)
            self.speculator.record_outcome(rid, sources[:len(d)], verdict.num_accepted)
            if not step.finished:
                seq.num_computed += verdict.num_accepted
                self._observe(seq, item.start, taps, first,
                              item.num_tokens + verdict.num_accepted, step.new_token_ids, dst)
            outputs.append(step)
        drafted = any(src[0].startswith("drafter") for _, src in drafts.values() if src)
        self._time_step(drafted, not drafted and bool(extra))
        return outputs

    def _taps_dst(self, scheduled, extra: dict[str, list[int]]) -> list[int] | None:
        """Where the step's taps go in the drafter's history (`step_drafts.taps_dst`) when the
        runner's taps sink is that history; else None (the taps come back to `observe`)."""
        prop = self.speculator.drafter if self.speculator.needs_taps else None
        if not isinstance(prop, PluginDrafterProposer) \
                or getattr(self.runner, "taps_sink", None) is not prop.runner.history:
            return None
        return taps_dst(prop, scheduled, extra)

    def _forward_deferred(self, meta, scheduled, extra: dict[str, list[int]],
                          deferred: DeferredDrafts, sink: dict):
        """The target pass with the drafter's drafts read on the device (`extra` holds zeros
        for them); sink: `runner.forward`'s taps_dst, if any. Returns its (logits, taps) and
        (the drafts, int64 [S, n] on the device; request id -> its row's flat offset)."""
        dst, src, row_of = deferred_slots(scheduled, extra, deferred)
        deferred.ready_here()
        logits, taps = self.runner.forward(meta, self.tap_layers,
                                           draft_ids=(dst, src, deferred.flat), **sink)
        return logits, taps, (deferred.drafts, row_of)

    def _time_step(self, drafted: bool, copy_only: bool) -> None:
        """The drafter gate's clock (a step lasts from the end of the previous one to now;
        not after an idle engine; drafted, copy_only: `Speculator.record_step`'s) and the
        next round's prefetch, whose launch so counts in the step that uses it."""
        now = time.perf_counter()
        if self._step_mark is not None:
            self.speculator.record_step(now - self._step_mark, drafted, copy_only)
        if self.speculator.wants_prefetch():
            self.speculator.prefetch(self._draft_items())
        self._step_mark = now if self.scheduler.has_work() else None

    def _verify_all(self, seqs: list[Sequence], logits: torch.Tensor,
                    extra: dict[str, list[int]], on_device=None,
                    chain: list[tuple[str, int, int, int]] | None = None
                    ) -> dict[str, Verdict]:
        """`step_verification.verify_step` with this engine's speculator and acceptance
        method (a method of its own, so that profilers can time it); chain: the streams whose
        next drafter round is enqueued while the host waits for the step's tokens
        (`step_drafts.chain_items`)."""
        hook = None if chain is None else (
            lambda own: self.speculator.chain(chain, own, self.runner.last_input_ids))
        return verify_step(seqs, logits, extra, self.speculator, self.args.acceptance_method,
                           on_device, self._reader, hook)

    def _propose(self) -> dict[str, tuple[list[int], list[str]]]:
        """Drafts for every running stream that is past its prefill (one batched round)."""
        return self.speculator.propose_all(self._draft_items())

    def _draft_items(self) -> list[tuple[str, list[int], int]]:
        """(request id, prompt + output tokens, room for drafts) per running stream past its
        prefill (`Speculator.propose_all` / `prefetch`)."""
        items = []
        for seq in self.scheduler.running:
            if seq.num_pending != 1:
                continue
            proc = self.requests[seq.request_id][1]
            room = min(proc.max_new_tokens - len(seq.output_token_ids) - 1,
                       self.args.max_model_len - seq.num_tokens - 1)
            items.append((seq.request_id, seq.prompt_token_ids + seq.output_token_ids, room))
        return items

    def _observe(self, seq: Sequence, start: int, taps, first: int, n: int,
                 committed: list[int], sink: list[int] | None) -> None:
        """Positions start .. start + n - 1 of `seq` are committed (`committed`: its new
        tokens); their taps are rows first .. of `taps`, or in the drafter's history
        already (sink: the step's taps_dst)."""
        rows = None if taps is None else taps[first:first + n]
        self.speculator.observe(seq.request_id, start, rows, committed,
                                n if sink is not None else 0)

    def _record(self, step: StepOutput, sources: list[str], accepted: int) -> None:
        m = step.output.metrics.spec
        m.record(sources, accepted, len(step.new_token_ids))
        self.stats.record(sources, accepted, len(step.new_token_ids))

    def _commit(self, seq: Sequence, tokens: list[int]) -> StepOutput:
        _, proc, out = self.requests[seq.request_id]
        now = time.perf_counter()
        committed, delta = [], ""
        for tok in tokens:
            seq.output_token_ids.append(tok)
            committed.append(tok)
            delta += proc.append(tok)
            if proc.finish_reason is not None:
                break
        if out.metrics.time_to_first_token_s is None:
            out.metrics.time_to_first_token_s = now - seq.arrival_time
        out.token_ids.extend(committed)
        out.text = proc.text
        out.metrics.num_generated_tokens = len(out.token_ids)
        out.metrics.num_steps += 1
        out.metrics.num_preemptions = seq.num_preemptions
        if proc.finish_reason is not None:
            out.finish_reason = proc.finish_reason
            out.metrics.total_time_s = now - seq.arrival_time
            self.scheduler.finish(seq)
            self.speculator.drop(seq.request_id)
            del self.requests[seq.request_id]
        return StepOutput(seq.request_id, committed, delta, out, proc.finish_reason is not None)

    @torch.no_grad()
    def score(self, token_ids: list[int]) -> torch.Tensor:
        """Teacher-forced logits of a token sequence through the paged cache (vLLM's prompt
        logprobs): fp32 [len - 1, V], row i = the next-token logits after token_ids[:i + 1].
        Runs in chunks of max_num_batched_tokens; needs an idle engine.

        Raises:
            RuntimeError: requests are in flight; ValueError: a bad prompt.
        """
        if self.scheduler.has_work():
            raise RuntimeError("score() needs an idle engine")
        self._check_prompt(token_ids)
        seq = Sequence("score", list(token_ids), SamplingParams())
        blocks = self.scheduler.blocks
        if not blocks.can_admit(len(token_ids)):
            raise ValueError("token_ids: longer than the KV cache can hold")
        blocks.admit(seq)
        blocks.grow(seq, len(token_ids))
        rows = []
        try:
            g, step = self.cache.geometry, self.args.max_num_batched_tokens
            for start in range(0, len(token_ids) - 1, step):
                n = min(step, len(token_ids) - 1 - start)
                meta = build_metadata([ScheduledSeq(seq, start, n)], g.block_size,
                                      g.ring_blocks, all_rows=True)
                rows.append(self.runner.forward(meta)[0])
        finally:
            blocks.free(seq)
        return torch.cat(rows)

    def abort(self, request_id: str) -> None:
        """Drop a request and free its cache blocks (a client went away)."""
        entry = self.requests.pop(request_id, None)
        if entry is None:
            return
        seq = entry[0]
        if seq in self.scheduler.waiting:
            self.scheduler.waiting.remove(seq)
        self.scheduler.finish(seq)
        self.speculator.drop(request_id)

"""`LLM`: the offline Python API, in the shape vLLM users know.

    llm = LLM("engines/gb10", speculative="off")
    outs = llm.generate(["Grüß Gott!"], SamplingParams(max_tokens=32))
    for delta in llm.stream("Erzähl mir was.", SamplingParams(max_tokens=32)): print(delta, end="")
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from ..sampling import SamplingParams
from .engine import EngineArgs, LLMEngine
from .output import RequestOutput

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}


class LLM:
    """Many prompts at once through one `LLMEngine` (continuous batching).

    Args:
        engine_dir: folder written by `build.py` (manifest.json, target/, drafter/).
        speculative: "off" | "copy" | "drafter" | "copy+drafter".
        max_num_seqs, max_model_len, kv_cache_memory (bytes), block_size,
        max_num_batched_tokens: see `EngineArgs`.
        device: "cpu" or "cuda[:N]" (CUDA runs the kernels of plugins/ with CUDA graphs).
        engine_options: further `EngineArgs` fields (num_speculative_tokens, drafter_depth,
            model_impl, enforce_eager); an unknown name raises TypeError.
        tensor_parallel_size: ranks of a tensor-parallel engine (`build.py --tp N`); must equal
            the engine's tp_size. N > 1 spawns N - 1 worker processes (rank 0 is this one);
            `shutdown()` or `with LLM(...) as llm:` stops them (garbage collection does too).
    Raises:
        ValueError: an unknown option or value (the message names it); CheckpointError: a bad
        engine folder; NotImplementedError: a speculative mode not implemented yet.
    """

    def __init__(self, engine_dir: str | Path, speculative: str = "copy+drafter", *,
                 max_num_seqs: int = 8, max_model_len: int = 4096,
                 kv_cache_memory: int = 1 << 30, block_size: int = 16,
                 max_num_batched_tokens: int = 512, device: str = "cpu",
                 tensor_parallel_size: int = 1, **engine_options):
        args = EngineArgs(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                          kv_cache_memory=kv_cache_memory, block_size=block_size,
                          max_num_batched_tokens=max_num_batched_tokens, **engine_options)
        self.engine = _make_engine(engine_dir, speculative, args, device, tensor_parallel_size)
        self.tokenizer = self.engine.tokenizer

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (nothing to do at tensor_parallel_size 1)."""
        stop = getattr(self.engine, "shutdown", None)
        if stop is not None:
            stop()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def generate(self, prompts: str | list[int] | Sequence[str | list[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """One output per prompt, in prompt order. A prompt is text (BOS is added) or token ids
        (used as they are); `params` is one SamplingParams for all or one per prompt."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        plist = _per_prompt(params, len(prompts))
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, plist)]
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for step in self.engine.step():
                if step.finished:
                    done[step.request_id] = step.output
        return [done[i] for i in ids]

    def chat(self, messages: Sequence[Message] | Sequence[Sequence[Message]],
             params: SamplingParams | Sequence[SamplingParams] | None = None
             ) -> list[RequestOutput]:
        """Like `generate` for conversations, rendered with the chat template."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        return self.generate([self.tokenizer.apply_chat_template(list(c)) for c in convs], params)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None
               ) -> Iterator[str]:
        """Yield text deltas of one request as they are committed; their concatenation
        equals the `.text` that `generate` returns for the same request."""
        rid = self.engine.add_request(prompt, params or SamplingParams())
        finished = False
        while not finished:
            for step in self.engine.step():
                if step.request_id == rid:
                    if step.delta_text:
                        yield step.delta_text
                    finished = step.finished


def _make_engine(engine_dir, speculative: str, args: EngineArgs, device: str,
                 tensor_parallel_size: int) -> LLMEngine:
    """An LLMEngine, or a TPLLMEngine (`tp_worker.py`) for tensor_parallel_size > 1. Raises
    ValueError naming tensor_parallel_size when it is not the engine's manifest tp_size."""
    from .engine_loader import Manifest
    from .tensor_parallel import check_tensor_parallel_size
    check_tensor_parallel_size(Manifest.read(engine_dir), tensor_parallel_size)
    if (tensor_parallel_size > 1 and str(device).startswith("cuda") and not args.enforce_eager
            and args.model_impl != "reference" and not args.tp_cuda_graphs):
        raise ValueError("enforce_eager: tensor_parallel_size > 1 on CUDA needs "
                         "enforce_eager=True so far (NCCL all-reduces captured in CUDA graphs "
                         "did not finish on 2xH200 in bench/tp_check.py; eager TP2 ran); "
                         "tp_cuda_graphs=True tries graphs anyway (experimental)")
    if tensor_parallel_size == 1:
        return LLMEngine(engine_dir, speculative, args, device)
    from .tp_worker import TPLLMEngine
    return TPLLMEngine(engine_dir, speculative, args, device, tensor_parallel_size)


def _per_prompt(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"params: {len(params)} SamplingParams for {n} prompts")
    return params

"""Turning committed tokens into text: stop conditions, stop strings and streaming deltas.

Tokens are committed one at a time (also when a step accepts several), so generation ends at
the first token that completes a stop condition and nothing after it is emitted. A stop string
ends generation at the earliest place it occurs in the text, whatever its index in the list.
Streamed deltas hold back (a) bytes of an unfinished UTF-8 character and (b) a tail that could
still become a stop string, so the concatenated stream always equals the final `.text`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sampling import SamplingParams
from ..spec.metrics import SpecMetrics
from ..tokenizer import KolibriTokenizer


@dataclass
class RequestMetrics:
    """Per-request figures. Times in seconds; rates in tokens per second."""

    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    time_to_first_token_s: float | None = None
    total_time_s: float | None = None
    num_preemptions: int = 0
    num_steps: int = 0              # target passes that produced tokens for this request
    spec: SpecMetrics = field(default_factory=SpecMetrics)  # drafts proposed / accepted

    @property
    def decode_tokens_per_s(self) -> float | None:
        if not self.total_time_s or self.time_to_first_token_s is None:
            return None
        decode_time = self.total_time_s - self.time_to_first_token_s
        n = self.num_generated_tokens - 1
        return n / decode_time if n > 0 and decode_time > 0 else None


@dataclass
class RequestOutput:
    """What `LLM.generate` returns per prompt (vLLM's shape).

    token_ids: generated ids, the one that ended generation included (EOS, a stop id, or the
    token that completed a stop string); text: their decoded text without special tokens, cut
    before a stop string; finish_reason: "stop" or "length".
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class StepOutput:
    """What one step did for one request: the tokens it committed and the text they freed.
    `finished`: the request ended at this step. Later steps keep updating `output`, so a
    consumer on another thread must test `finished`, not `output.finished`."""

    request_id: str
    new_token_ids: list[int]
    delta_text: str
    output: RequestOutput
    finished: bool


class OutputProcessor:
    """Applies one request's stop rules token by token and produces text deltas."""

    def __init__(self, tokenizer: KolibriTokenizer, params: SamplingParams,
                 eos_token_ids: tuple[int, ...], max_new_tokens: int):
        self.params = params
        self.detok = tokenizer.incremental_detokenizer()
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos
                                                      else set(eos_token_ids))
        self.max_new_tokens = max_new_tokens
        self.longest_stop = max((len(s) for s in params.stop), default=0)
        self.text = ""          # decoded so far (may include a held-back tail)
        self.emitted = 0        # characters of self.text already handed out
        self.num_tokens = 0
        self.finish_reason: str | None = None

    def append(self, token_id: int) -> str:
        """Commit one token; returns the new text that may be shown. After the request has
        finished (see `finish_reason`) every further call raises RuntimeError."""
        if self.finish_reason is not None:
            raise RuntimeError("request already finished; no token may follow")
        self.num_tokens += 1
        if token_id in self.stop_ids:
            self.text += self.detok.finish()
            return self._end("stop", len(self.text))
        before = len(self.text)
        self.text += self.detok.add(token_id)
        cut = self._find_stop(before)
        if cut is not None:
            return self._end("stop", cut)
        if self.num_tokens >= self.max_new_tokens:
            self.text += self.detok.finish()
            cut = self._find_stop(before)
            return self._end("stop" if cut is not None else "length",
                             cut if cut is not None else len(self.text))
        return self._release(len(self.text) - self._held_back())

    def _find_stop(self, before: int) -> int | None:
        """Earliest start of a stop string that the new text completes, or None."""
        start = max(0, before - self.longest_stop + 1)
        hits = [i for s in self.params.stop if (i := self.text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _held_back(self) -> int:
        """Length of the longest tail that is a proper prefix of some stop string."""
        for n in range(min(self.longest_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.params.stop):
                return n
        return 0

    def _end(self, reason: str, cut: int) -> str:
        self.finish_reason = reason
        self.text = self.text[:cut]
        return self._release(cut)

    def _release(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        delta = self.text[self.emitted:upto]
        self.emitted = upto
        return delta

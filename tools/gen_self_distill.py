#!/usr/bin/env python3
r"""Self-distillation data for the block drafter: the target's own greedy continuations.

The prompts are made from the training corpus; our engine continues them:

    PYTHONPATH=. python tools/gen_self_distill.py --engine engines/mini-h200 --device cuda \
        --corpus corpus/train.jsonl.xz --out runs/gen/train.npy [--time-budget-s 150]

On a CPU (a small trial): an engine of `python build.py --target cpu` (engines/cpu),
--device cpu --samples 24 --max-tokens 16; `train_drafter.py --generated` needs at least
(--seq-len + 1) / 0.05 tokens of it (its held-out 5 %).

Why: the drafter trained on corpus text alone (`tools/train_drafter.py`) sees, at serving
time, contexts the target wrote itself, which are more repetitive and differently phrased; at
the copy lookup's misses its drafts were accepted 0.83 per round on German prompts and 1.08
on chat (bench/results/h200-2026-11-30h/zs/; 0.91 and 1.30 after one round of this,
../h200-2026-11-30i/se/). Training on the target's own outputs is how EAGLE and Medusa-2
("self-distillation") see serving-like contexts.

Prompts (seeded, from `--corpus`, never from the evaluation sets; the corpus itself passed
`tools/corpus.py`'s contamination check): a `--instruction-fraction` of them wrap one to three
sentences of an English or German document in one of INSTRUCTIONS (task wordings of the kinds
users send: translation, summary, explanation, question; code documents get CODE_INSTRUCTIONS);
the rest are a document's first 16-192 tokens. Each is tokenized as the evaluation's raw
template does (BOS + text) and continued greedily for `--max-tokens` tokens (ignore_eos; copy
drafting, which is lossless, only makes it faster).

Output (`--out`, written atomically): uint16 [N] token stream, per sample <s> prompt
continuation </s> (the layout of `train_common.tokenize_corpus`, so `train_drafter.py
--generated` takes windows of it as of the corpus), and the same name with .json (train.npy ->
train.json) holding the counts, the seconds and the generation speed. Stops early (keeping
every finished chunk) when `--time-budget-s` runs out. A continuation runs past the target's
own </s> (ignore_eos, as the evaluation generates), so it may hold </s><s> and a document the
target began itself.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
import gpu_env  # noqa: E402,F401
from train_common import write_bytes_atomic  # noqa: E402

from kolibri_trt.runtime.llm import LLM  # noqa: E402
from kolibri_trt.sampling import SamplingParams  # noqa: E402

INSTRUCTIONS = {
    "de": ("Translate German to English: {}", "Übersetze ins Englische: {}",
           "Fasse den folgenden Text zusammen: {}", "Erkläre, was hier gemeint ist: {}",
           "Was bedeutet der folgende Satz? {}", "Schreibe einen Absatz über: {}"),
    "en": ("Translate English to German: {}", "Summarize the following text: {}",
           "Explain what this means: {}", "Answer the question about this text: {}",
           "Write a short paragraph about: {}", "Rewrite this in simpler words: {}"),
}
CODE_INSTRUCTIONS = ("Explain what this code does:\n{}", "Complete the following code:\n{}",
                     "Write a docstring for this code:\n{}")
SENTENCE = re.compile(r"(?<=[.!?])\s+")
PREFIX_TOKENS = (16, 192)      # plain prompts: a document's first tokens, drawn uniformly
SENTENCES = (1, 3)             # instruction prompts: this many sentences of a document
MAX_PROMPT_CHARS = 600         # an instruction prompt's text at most


def make_prompt(doc: dict, instruction: bool, rng: np.random.Generator, tokenizer) -> list[int]:
    """One prompt's token ids (BOS + text) from a corpus document {"lang", "text"}."""
    text = doc["text"].strip()
    if instruction:
        if doc["lang"] == "code":
            snippet = "\n".join(text.splitlines()[: int(rng.integers(4, 16))])
            return tokenizer.encode(CODE_INSTRUCTIONS[rng.integers(len(CODE_INSTRUCTIONS))]
                                    .format(snippet)[:MAX_PROMPT_CHARS], add_bos=True)
        sents = [s for s in SENTENCE.split(" ".join(text.split())) if len(s.split()) >= 4]
        if sents:
            k = int(rng.integers(SENTENCES[0], SENTENCES[1] + 1))
            i = int(rng.integers(max(1, len(sents) - k + 1)))
            body = " ".join(sents[i:i + k])[:MAX_PROMPT_CHARS]
            tmpl = INSTRUCTIONS[doc["lang"]]
            return tokenizer.encode(tmpl[rng.integers(len(tmpl))].format(body), add_bos=True)
    ids = tokenizer.encode(text, add_bos=True)
    return ids[: int(rng.integers(PREFIX_TOKENS[0], PREFIX_TOKENS[1] + 1))]


def load_docs(path: Path) -> list[dict]:
    """The corpus documents ({"lang", "source", "text"} per line of a .jsonl.xz)."""
    if not path.is_file():
        raise FileNotFoundError(f"--corpus: {path} does not exist (tools/corpus.py makes it)")
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--engine", type=Path, required=True, help="engine folder (build.py output)")
    a("--corpus", type=Path, default=ROOT / "corpus" / "train.jsonl.xz",
      help="corpus file (.jsonl.xz: tools/corpus.py, corpus_subset.py) the prompts come from")
    a("--out", type=Path, required=True, help="token stream .npy to write")
    a("--device", default="cuda", help="cuda or cpu")
    a("--samples", type=int, default=8192, help="prompts to continue, at most")
    a("--max-tokens", type=int, default=384, help="tokens generated per prompt")
    a("--instruction-fraction", type=float, default=0.5)
    a("--chunk", type=int, default=256, help="prompts per generate call (progress, budget)")
    a("--max-num-seqs", type=int, default=64, help="streams decoded together")
    a("--speculative", default="copy", choices=("off", "copy"))
    a("--kv-cache-gib", type=float, default=4.0, help="KV cache memory (GiB)")
    a("--time-budget-s", type=float, help="stop after the chunk that passes this")
    a("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0.0 <= args.instruction_fraction <= 1.0:
        raise SystemExit(f"--instruction-fraction: must be in [0, 1], got "
                         f"{args.instruction_fraction}")
    t0 = time.perf_counter()
    docs = load_docs(args.corpus)
    llm = LLM(args.engine, speculative=args.speculative, max_num_seqs=args.max_num_seqs,
              max_model_len=PREFIX_TOKENS[1] + 256 + args.max_tokens, device=args.device,
              kv_cache_memory=int(args.kv_cache_gib * (1 << 30)))
    tok = llm.tokenizer
    bos, eos = tok.bos_token_id, tok.eos_token_id
    rng = np.random.default_rng(args.seed)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    stream: list[np.ndarray] = []
    done = generated = 0
    t_gen = time.perf_counter()
    while done < args.samples:
        n = min(args.chunk, args.samples - done)
        picks = rng.integers(len(docs), size=n)
        instr = rng.random(n) < args.instruction_fraction
        prompts = [make_prompt(docs[i], bool(f), rng, tok) for i, f in zip(picks, instr)]
        for out in llm.generate(prompts, params):
            ids = [t for t in out.prompt_token_ids if t != bos] + out.token_ids
            stream.append(np.asarray([bos, *ids, eos], dtype=np.uint16))
            generated += len(out.token_ids)
        done += n
        el = time.perf_counter() - t_gen
        print(f"{done}/{args.samples} prompts, {generated} tokens generated, "
              f"{generated / el:,.0f} tokens/s", flush=True)
        if args.time_budget_s is not None and time.perf_counter() - t0 > args.time_budget_s:
            print(f"--time-budget-s {args.time_budget_s} reached", flush=True)
            break
    arr = np.concatenate(stream)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    write_bytes_atomic(args.out, buf.getvalue())
    meta = {"samples": done, "tokens": int(arr.size), "generated_tokens": generated,
            "max_tokens": args.max_tokens, "instruction_fraction": args.instruction_fraction,
            "seed": args.seed, "engine": str(args.engine), "speculative": args.speculative,
            "generate_s": round(time.perf_counter() - t_gen, 1),
            "tokens_per_s": round(generated / (time.perf_counter() - t_gen), 1)}
    write_bytes_atomic(args.out.with_suffix(".json"), json.dumps(meta, indent=1).encode())
    print(json.dumps(meta), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Calibration activations for the static input scales, captured from the reference model.

The built-in sentences (`build/calibration.toml`: English, German, code; not evaluation
prompts) are tokenized with the checkpoint's own tokenizer and run one at a time through
`KolibriForCausalLM.residual_stream` in bf16. Forward hooks keep, per layer, the inputs of the
quantized linears: `input_layernorm`'s output (q/k/v), `o_proj`'s input, and
`post_attention_layernorm`'s output (router, every routed expert and the shared expert: each
expert is calibrated on all tokens, not only those routed to it, so no expert is left without
a scale); `model.norm` of the last residual stream feeds the LM head. The drafter's head input
is `drafter.norm`'s output over one block pass per sentence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import BuildError
from .recipes import CalibrationSet


@dataclass
class Captures:
    """Per-sequence activations (bf16, [T, width]); `attn_in[L]`, `o_in[L]`, `moe_in[L]` are
    lists over sequences for layer L; `head_in`, `taps` ([T, n_taps, H]) and `ids` ([T])
    are lists over sequences."""

    attn_in: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    o_in: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    moe_in: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    head_in: list[torch.Tensor] = field(default_factory=list)
    taps: list[torch.Tensor] = field(default_factory=list)
    ids: list[torch.Tensor] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(int(t.numel()) for t in self.ids)


def tokenize(cal: CalibrationSet, tokenizer_dir: Path, bos_id: int, vocab_size: int,
             max_tokens: int) -> list[torch.Tensor]:
    """int64 [T] per sentence: <bos> + tokens, cut to `max_tokens`.

    Raises:
        BuildError: tokenizer.json missing, or a token id outside the model's vocabulary.
    """
    from tokenizers import Tokenizer

    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise BuildError(f"{path}: missing; calibration and the engine need the checkpoint's "
                         "tokenizer")
    tok = Tokenizer.from_file(str(path))
    out = []
    for _, text in cal.texts:
        ids = [bos_id] + tok.encode(text, add_special_tokens=False).ids
        if max(ids) >= vocab_size:
            raise BuildError(f"{path}: token id {max(ids)} is outside the model's vocabulary "
                             f"[0, {vocab_size})")
        out.append(torch.tensor(ids[:max_tokens], dtype=torch.long))
    return out


def capture_target(model, sequences: list[torch.Tensor], tap_layers: tuple[int, ...],
                   on_sequence=None) -> Captures:
    """Run the reference target over `sequences` and keep the quantized linears' inputs.

    model: KolibriForCausalLM (bf16); tap_layers: the drafter's target_layer_ids.
    on_sequence: called after each sequence (progress). Raises BuildError if a hooked module
    was never called (the reference no longer goes through it).
    """
    cap = Captures()
    hooks = _register_hooks(model, cap)
    try:
        with torch.no_grad():
            for ids in sequences:
                h, taps = model.residual_stream(ids[None], tap_layers)
                cap.head_in.append(model.model.norm(h)[0])
                cap.taps.append(taps[0])
                cap.ids.append(ids)
                if on_sequence is not None:
                    on_sequence()
    finally:
        for hook in hooks:
            hook.remove()
    _check_complete(cap, model.config.num_hidden_layers, len(sequences))
    return cap


def _register_hooks(model, cap: Captures) -> list:
    def keep(store: dict, layer: int, pre: bool):
        def hook(module, args, output=None):
            x = args[0] if pre else output
            store.setdefault(layer, []).append(x.detach().reshape(-1, x.shape[-1]))
        return hook

    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.input_layernorm.register_forward_hook(keep(cap.attn_in, i, False)))
        hooks.append(layer.self_attn.o_proj.register_forward_pre_hook(keep(cap.o_in, i, True)))
        hooks.append(layer.post_attention_layernorm.register_forward_hook(
            keep(cap.moe_in, i, False)))
    return hooks


def _check_complete(cap: Captures, layers: int, sequences: int) -> None:
    for what, store in (("input_layernorm", cap.attn_in), ("self_attn.o_proj", cap.o_in),
                        ("post_attention_layernorm", cap.moe_in)):
        for i in range(layers):
            if len(store.get(i, [])) != sequences:
                raise BuildError(f"calibration: model.layers.{i}.{what} was not called once per "
                                 "sequence by the reference forward; cannot capture its input")


def capture_drafter_head(drafter, cap: Captures) -> list[torch.Tensor]:
    """The drafter head's inputs RMSNorm(g_j; norm), [B, H] per sentence, from one block pass
    anchored at the sentence's second-to-last position (sentences of < 2 tokens are skipped)."""
    out: list[torch.Tensor] = []
    hook = drafter.norm.register_forward_hook(
        lambda module, args, output: out.append(output.detach().reshape(-1, output.shape[-1])))
    try:
        with torch.no_grad():
            for ids, taps in zip(cap.ids, cap.taps):
                if ids.numel() >= 2:
                    p = ids.numel() - 2
                    drafter.propose(taps[:p + 1], ids[1:p + 2])
    finally:
        hook.remove()
    if not out:
        raise BuildError("calibration: the drafter head saw no input (all sentences too short)")
    return out

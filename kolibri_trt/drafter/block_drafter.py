"""`KolibriBlockDrafter`: the block drafter's reference forward pass and checkpoint I/O.

Maths: `shared/spec/block-drafter.md` §Forward pass and §Depth. Layers: `reference.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from kolibri_trt_plugins.vocab_argmax import KeyedRows, vocab_argmax_ref

from ..checkpoint import load_tensors, save_tensors
from ..config_io import read_json, write_json_atomic
from ..errors import CheckpointError
from ..model import ops
from ..model.reference import KolibriForCausalLM, Linear, RMSNorm
from .config import DrafterConfig
from .reference import DrafterLayer, DrafterTarget, Predecessor

DRAFT_VOCAB = "draft_vocab.json"


@dataclass(frozen=True)
class BlockProposal:
    """One drafter pass over S streams.

    draft_ids: int64 [S, B] target token ids for positions p+2 .. p+B+1 of each stream.
    logits: fp32 [S, B, draft_vocab_size] over the draft vocabulary.
    states: [S, B, H] the rows' g_j (model dtype): the fused states of the next depth pass.
    """

    draft_ids: torch.Tensor
    logits: torch.Tensor
    states: torch.Tensor


class KolibriBlockDrafter(nn.Module):
    """Block drafter over a Kolibri-1 target (`shared/spec/block-drafter.md`).

    Parameter names are the checkpoint's tensor names. `draft_vocab` (int64 [Vd]) maps a
    draft-vocabulary index to a target token id; the head is `target.lm_head[draft_vocab]`.
    """

    def __init__(self, config: DrafterConfig, target: DrafterTarget, draft_vocab: torch.Tensor):
        super().__init__()
        c = config
        self.config = c
        self.tap_norms = nn.ModuleList(RMSNorm(c.target_hidden_size, c.rms_norm_eps)
                                       for _ in range(c.num_taps))
        self.fuse = Linear(c.num_taps * c.target_hidden_size, c.hidden_size)
        self.fc = Linear(2 * c.hidden_size, c.hidden_size)
        self.mask_embedding = nn.Parameter(torch.zeros(c.hidden_size))
        self.layers = nn.ModuleList(DrafterLayer(c, i) for i in range(c.num_hidden_layers))
        self.predecessor = Predecessor(c.hidden_size, c.predecessor_rank)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.target = target
        self.register_buffer("draft_vocab", draft_vocab.long(), persistent=False)
        # [Vd, H] head rows stored with an engine (dequantized); None: target.lm_head[draft_vocab]
        self.head_slice: torch.Tensor | None = None

    # ---- the pass ------------------------------------------------------------------------
    def fuse_taps(self, taps: torch.Tensor) -> torch.Tensor:
        """taps [P, n_taps, Ht] (raw residual stream after target_layer_ids) -> fused [P, H]."""
        normed = [norm(taps[:, i]) for i, norm in enumerate(self.tap_norms)]
        return self.fuse(torch.cat(normed, dim=-1))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """E[token_ids] from the target's embedding, in the drafter's dtype."""
        return F.embedding(token_ids, self.target.embed_tokens).to(self.fc.weight.dtype)

    def context_rows(self, fused: torch.Tensor, next_token_ids: torch.Tensor) -> torch.Tensor:
        """ctx_i = fc(cat(fused_i, E[t_{i+1}])): fused [N, H], next_token_ids int64 [N] -> [N, H]."""
        return self.fc(torch.cat([fused, self.embed(next_token_ids)], dim=-1))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's keys/values of context rows ctx [N, H] at `positions` int64 [N]."""
        return [layer.kv(ctx, positions) for layer in self.layers]

    def block_pass(self, fused: torch.Tensor, next_token_ids: torch.Tensor) -> BlockProposal:
        """One pass of one stream with anchor p = P - 1 (reference: context recomputed).

        fused: [P, H] fused states of positions 0..p; next_token_ids: int64 [P], t_{i+1}.
        Context rows are ctx_i = fc(cat(fused_i, E[t_{i+1}])) for max(0, p - context_window)
        <= i < p; row 0 = ctx_p; rows j >= 1 = fc(cat(fused_p, mask_embedding)).
        Returns a BlockProposal with S = 1.
        """
        p = fused.shape[0] - 1
        start = max(0, p - self.config.context_window)
        ctx = self.context_rows(fused[start:], next_token_ids[start:])
        kv = self.context_kv(ctx[:-1], torch.arange(start, p, device=fused.device))
        return self.block_pass_cached(fused[p:], ctx[-1:], [p], [kv])

    def block_pass_cached(self, anchor_fused: torch.Tensor, anchor_ctx: torch.Tensor,
                          anchors: list[int], kvs: list[list[tuple[torch.Tensor, torch.Tensor]]],
                          keys: tuple[torch.Tensor, ...] | None = None) -> BlockProposal:
        """One batched pass of S streams from cached context keys/values.

        anchor_fused, anchor_ctx: [S, H] fused_p and ctx_p; anchors: the S anchor positions;
        kvs[s][l]: layer l's (k, v) [C, Hkv, D] of stream s's context rows at positions
        p - C .. p - 1, C = min(p, context_window); keys: None (greedy heads) or per stream
        (temperature fp32 [S], seed_key int64 [S], base int64 [S]): coupled picks
        (`_heads`).
        """
        c = self.config
        mask = self.mask_embedding.to(anchor_fused.dtype).expand(anchor_fused.shape[0], -1)
        mask_rows = self.fc(torch.cat([anchor_fused, mask], dim=-1))
        x = torch.cat([anchor_ctx[:, None], mask_rows[:, None].expand(-1, c.block_size - 1, -1)],
                      dim=1)
        row_pos = torch.tensor(anchors, device=x.device)[:, None] + \
            torch.arange(c.block_size, device=x.device)[None, :]
        for i, layer in enumerate(self.layers):
            x = layer(x, [kv[i] for kv in kvs], row_pos)
        return self._heads(x, None if keys is None else (row_pos, keys))

    def _heads(self, x: torch.Tensor, keyed: tuple | None = None) -> BlockProposal:
        """Sequential output heads over rows j (all streams at once): g_0 = x_0;
        g_j = predecessor(x_j, E[d_j]) for j >= 1. x: [S, B, H]. keyed: None (greedy picks), or
        (row positions int64 [S, B], per-stream (temperature, seed_key, base)): a stream with
        temperature > 0 picks argmax of logits / T plus the target sampler's Gumbel noise at
        the draft's output position (kolibri_trt_plugins.vocab_argmax, `KeyedRows`)."""
        head = self.head_slice if self.head_slice is not None \
            else self.target.lm_head[self.draft_vocab]
        states, logits, drafts = [], [], []
        for j in range(x.shape[1]):
            g = x[:, j] if j == 0 else self.predecessor(x[:, j], self.embed(drafts[-1]))
            lj = ops.linear(self.norm(g).float(), head.float())
            # argmax returns the first maximum: ties go to the lower draft-vocabulary index
            if keyed is None:
                drafts.append(self.draft_vocab[torch.argmax(lj, dim=-1)])
            else:
                rows = KeyedRows(torch.arange(x.shape[0], device=x.device), keyed[0][:, j],
                                 *keyed[1])
                drafts.append(vocab_argmax_ref(lj, self.draft_vocab, rows))
            states.append(g)
            logits.append(lj)
        return BlockProposal(torch.stack(drafts, 1), torch.stack(logits, 1), torch.stack(states, 1))

    @torch.no_grad()
    def propose_cached(self, fused_p: torch.Tensor, next_p: torch.Tensor, anchors: list[int],
                       kvs: list[list[tuple[torch.Tensor, torch.Tensor]]], depth: int,
                       keys: tuple[torch.Tensor, ...] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """`depth` batched passes for S streams from cached context keys/values (what an
        engine runs: every stream of the round in one pass).

        fused_p: [S, H] anchors' fused states; next_p: int64 [S] their sampled next tokens;
        anchors: anchor positions; kvs, keys: as `block_pass_cached`. Provisional rows of earlier
        passes go into copies of kvs and are dropped at return. Returns drafts int64
        [S, depth*B] and fp32 logits [S, depth*B, Vd] (per stream as `propose_depth`).
        """
        c, drafts, logits = self.config, [], []
        anchor_ctx = self.context_rows(fused_p, next_p)
        for r in range(depth):
            out = self.block_pass_cached(fused_p, anchor_ctx, anchors, kvs, keys)
            drafts.append(out.draft_ids)
            logits.append(out.logits)
            if r == depth - 1:
                break
            # positions p .. p+B-1 become context rows: fused (fused_p, g_0..g_{B-2}) with
            # next tokens (t_{p+1}, d_1..d_{B-1}); the new anchor p+B has g_{B-1} and d_B.
            kvs = [self._extend(kv, anchor_ctx[s], out, s, p) for s, (kv, p)
                   in enumerate(zip(kvs, anchors))]
            anchors = [p + c.block_size for p in anchors]
            fused_p = out.states[:, -1]
            anchor_ctx = self.context_rows(fused_p, out.draft_ids[:, -1])
        return torch.cat(drafts, 1), torch.cat(logits, 1)

    def _extend(self, kv, anchor_ctx: torch.Tensor, out: BlockProposal, s: int, p: int):
        """Stream s's context kv plus the provisional rows p .. p+B-1 of the pass `out`."""
        c = self.config
        rows = torch.cat([anchor_ctx[None],
                          self.context_rows(out.states[s, :-1], out.draft_ids[s, :-1])])
        new = self.context_kv(rows, p + torch.arange(c.block_size, device=rows.device))
        return [(torch.cat([k, nk])[-c.context_window:], torch.cat([v, nv])[-c.context_window:])
                for (k, v), (nk, nv) in zip(kv, new)]

    @torch.no_grad()
    def propose(self, taps: torch.Tensor, next_token_ids: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference one-pass proposal (spec §Reference API).

        taps: float [P, n_taps, Ht] at positions 0..p; next_token_ids: int64 [P], the last is
        the anchor's sampled token t_{p+1}. Returns draft_ids int64 [B] (greedy, positions
        p+2 .. p+B+1) and fp32 logits [B, draft_vocab_size].
        """
        self._check_inputs(taps, next_token_ids)
        out = self.block_pass(self.fuse_taps(taps.to(self.fc.weight.dtype)), next_token_ids)
        return out.draft_ids[0], out.logits[0]

    @torch.no_grad()
    def propose_depth(self, taps: torch.Tensor, next_token_ids: torch.Tensor, depth: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """`depth` passes before verification (spec §Depth): returns [depth*B] drafts and
        fp32 logits [depth*B, Vd].

        Pass r+1 treats pass r's drafts as accepted. Row j of a pass stands at position p+j
        and drafts the token at p+2+j, so its state g_j plays the target's fused state at
        position p+1+j (as a chain drafter's output does). The positions p+1 .. p+B become
        provisional context rows with fused state g_0 .. g_{B-1} and next tokens
        d_1 .. d_B; the new anchor p+B has fused state g_{B-1} and sampled token d_B, the
        last draft. (The spec says "each drafted position becomes a context row whose fused
        state is the drafter's own g_j"; this is the reading under which positions line up.)
        """
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._check_inputs(taps, next_token_ids)
        fused = self.fuse_taps(taps.to(self.fc.weight.dtype))
        drafts, logits = [], []
        for _ in range(depth):
            out = self.block_pass(fused, next_token_ids)
            drafts.append(out.draft_ids[0])
            logits.append(out.logits[0])
            fused = torch.cat([fused, out.states[0]], dim=0)
            next_token_ids = torch.cat([next_token_ids, out.draft_ids[0]])
        return torch.cat(drafts), torch.cat(logits)

    def _check_inputs(self, taps: torch.Tensor, next_token_ids: torch.Tensor) -> None:
        c = self.config
        if taps.dim() != 3 or taps.shape[1:] != (c.num_taps, c.target_hidden_size):
            raise ValueError(f"taps must be [P, {c.num_taps}, {c.target_hidden_size}], "
                             f"got {tuple(taps.shape)}")
        if next_token_ids.shape != (taps.shape[0],) or next_token_ids.dtype != torch.long:
            raise ValueError(f"next_token_ids must be int64 [{taps.shape[0]}], got "
                             f"{next_token_ids.dtype} {tuple(next_token_ids.shape)}")
        if taps.shape[0] < 1:
            raise ValueError("taps must hold at least the anchor position")

    # ---- checkpoint I/O ------------------------------------------------------------------
    @staticmethod
    def expected_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor name of a drafter checkpoint for `cfg` and its shape."""
        stub = DrafterTarget(torch.empty(0, device="meta"), torch.empty(0, device="meta"), 0)
        with torch.device("meta"):
            model = KolibriBlockDrafter(cfg, stub, torch.empty(0, dtype=torch.long))
        return {k: tuple(v.shape) for k, v in model.state_dict().items()}

    @classmethod
    def from_pretrained(cls, path: str | Path, target: "KolibriForCausalLM | DrafterTarget",
                        dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                        ) -> "KolibriBlockDrafter":
        """Load a drafter checkpoint and bind it to its target's embedding and lm_head.

        Raises:
            CheckpointError: bad config, a missing / unexpected / mis-shaped tensor, a bad
                draft_vocab.json (an id out of range, a duplicate, a wrong length), or a
                drafter that does not fit its target (target_layer_ids, hidden size); the
                message names the file and the field or tensor.
        """
        path = Path(path)
        cfg = DrafterConfig.from_json(path / "config.json")
        tgt = DrafterTarget.of(target)
        check_fits_target(cfg, tgt, path / "config.json")
        vocab = read_draft_vocab(path / DRAFT_VOCAB, cfg.draft_vocab_size, tgt.lm_head.shape[0])
        tensors = load_tensors(path, cls.expected_shapes(cfg), dtype=dtype, device=device)
        with torch.device("meta"):
            model = cls(cfg, tgt, torch.empty(0, dtype=torch.long))
        model.load_state_dict(tensors, strict=True, assign=True)
        model.draft_vocab = vocab.to(device)
        return model.requires_grad_(False).eval()

    def save_pretrained(self, path: str | Path) -> None:
        """Write config.json, model.safetensors and draft_vocab.json."""
        Path(path).mkdir(parents=True, exist_ok=True)
        save_tensors(path, self.state_dict())
        write_json_atomic(Path(path) / DRAFT_VOCAB, self.draft_vocab.tolist())
        self.config.save(path)


def check_fits_target(cfg: DrafterConfig, target: DrafterTarget, path: Path) -> None:
    """Raise CheckpointError (naming `path` and the field) if the drafter cannot read this
    target: a tapped layer the target lacks, or a hidden size that is not the target's."""
    hidden = target.embed_tokens.shape[1]
    if cfg.target_hidden_size != hidden:
        raise CheckpointError(path, f"{cfg.target_hidden_size} but the target's hidden_size "
                              f"is {hidden}", field="target_hidden_size")
    for i in cfg.target_layer_ids:
        if not 0 <= i < target.num_hidden_layers:
            raise CheckpointError(path, f"layer {i} does not exist in the target "
                                  f"({target.num_hidden_layers} layers)",
                                  field="target_layer_ids")


def read_draft_vocab(path: Path, size: int, target_vocab: int) -> torch.Tensor:
    """Read draft_vocab.json: `size` distinct target ids in [0, target_vocab); int64 [size]."""
    ids = read_json(path)
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                            for i in ids):
        raise CheckpointError(path, "must be a JSON list of integer token ids")
    if len(ids) != size:
        raise CheckpointError(path, f"has {len(ids)} ids, config draft_vocab_size is {size}")
    for k, i in enumerate(ids):
        if not 0 <= i < target_vocab:
            raise CheckpointError(path, f"entry {k}: token id {i} is outside the target "
                                  f"vocabulary [0, {target_vocab})")
    if len(set(ids)) != len(ids):
        raise CheckpointError(path, "token ids must be distinct")
    return torch.tensor(ids, dtype=torch.long)

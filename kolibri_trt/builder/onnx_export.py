"""`--export-onnx`: the drafter's one-pass graph (`shared/spec/block-drafter.md` §Forward pass).

Two files in `<engine>/onnx/`:
- `drafter.onnx`: quantized linears as `kolibri`-domain custom nodes carrying the engine's own
  tensors (`onnx_graph.py`; the TensorRT plugin path), bf16 linears as Cast + Gemm;
- `drafter_bf16.onnx`: every linear bf16 (Cast + Gemm), which onnxruntime runs on CPU.
Inputs: `taps` f32 [N, n_taps, Ht] for positions p-N+1 .. p (the caller cuts the context
window: N <= context_window + 1), `next_token_embeds` f32 [N, H] (E[t_{i+1}] from the target's
embedding), `anchor_position` int64 [] (p). Outputs: `draft_ids` int64 [B] (target ids),
`logits` f32 [B, Vd]. Initializer `draft_embed` is E[draft_vocab] (bf16) for the predecessor
head, `draft_vocab` maps draft indices to target ids. Compute is fp32, norms as the reference.
"""

from __future__ import annotations

from pathlib import Path

import torch
from onnx import TensorProto, helper

from .onnx_graph import DOMAIN, OPSET, Graph

IR_VERSION = 10
EXTERNAL_DATA_BYTES = 1_800_000_000


def _inputs(g: Graph, cfg, tensors: dict, fmt) -> tuple[str, str, str]:
    """fused, context rows and the block rows x [B, H] from the graph inputs."""
    normed = []
    for i in range(cfg.num_taps):
        tap = g.op("Gather", "taps", g.const(i, torch.int64), axis=1)
        w = g.tensor(f"tap_norms.{i}.weight", tensors[f"tap_norms.{i}.weight"])
        normed.append(g.rms_norm(tap, w, cfg.rms_norm_eps))
    fused = g.linear(g.op("Concat", *normed, axis=-1), "fuse", tensors, fmt("fuse"))
    ctx_all = g.linear(g.op("Concat", fused, "next_token_embeds", axis=-1), "fc", tensors,
                       fmt("fc"))
    n = g.op("Shape", "taps", start=0, end=1)
    last = g.op("Sub", n, g.const([1], torch.int64))
    mask = g.op("Cast", g.tensor("mask_embedding", tensors["mask_embedding"]),
                to=TensorProto.FLOAT)
    mask_in = g.op("Concat", g.slice(fused, last, n, 0),
                   g.op("Unsqueeze", mask, g.const([0], torch.int64)), axis=-1)
    mask_row = g.linear(mask_in, "fc", tensors, fmt("fc"))
    x = g.op("Concat", g.slice(ctx_all, last, n, 0), *[mask_row] * (cfg.block_size - 1), axis=0)
    return g.slice(ctx_all, 0, last, 0), x, last


def _positions(g: Graph, cfg, last: str):
    """RoPE tables of context rows (p-C .. p-1) and block rows (p .. p+B-1), and the mask
    allowed[j, k] = k <= C + j over keys [context rows, block rows]."""
    p = "anchor_position"
    c = g.op("Squeeze", last)
    ctx_pos = g.op("Range", g.op("Sub", p, c), p, g.const(1, torch.int64))
    steps = g.const(list(range(cfg.block_size)), torch.int64)
    row_pos = g.op("Add", p, steps)
    keys = g.op("Range", g.const(0, torch.int64), g.op("Add", c, g.const(cfg.block_size,
                                                                            torch.int64)),
                g.const(1, torch.int64))
    limit = g.op("Unsqueeze", g.op("Add", steps, c), g.const([1], torch.int64))
    allowed = g.op("LessOrEqual", g.op("Unsqueeze", keys, g.const([0], torch.int64)), limit)
    return (g.rope_tables(ctx_pos, cfg.head_dim, cfg.rope_theta),
            g.rope_tables(row_pos, cfg.head_dim, cfg.rope_theta), allowed)


def _layer(g: Graph, cfg, l: int, x: str, ctx: str, tables, tensors: dict, fmt) -> str:
    (cc, sc), (cr, sr), allowed = tables
    pre, b, d = f"layers.{l}", cfg.block_size, cfg.head_dim
    w = lambda n: g.tensor(f"{pre}.{n}.weight", tensors[f"{pre}.{n}.weight"])
    lin = lambda v, n: g.linear(v, f"{pre}.{n}", tensors, fmt(f"{pre}.{n}"))
    if l >= 1:
        prev = g.rms_norm(g.slice(x, 0, b - 1, 0), w("spine.norm"), cfg.rms_norm_eps)
        delta = lin(g.silu(lin(prev, "spine.A")), "spine.U")
        x = g.op("Concat", g.slice(x, 0, 1, 0), g.op("Add", g.slice(x, 1, b, 0), delta), axis=0)
    xn = g.rms_norm(x, w("input_layernorm"), cfg.rms_norm_eps)
    cn = g.rms_norm(ctx, w("input_layernorm"), cfg.rms_norm_eps)
    hq, hk = cfg.num_attention_heads, cfg.num_key_value_heads
    heads = lambda v, n, h: g.reshape(lin(v, f"self_attn.{n}"), [-1, h, d])
    q = g.rope(heads(xn, "q_proj", hq), cr, sr, d)
    k = g.op("Concat", g.rope(heads(cn, "k_proj", hk), cc, sc, d),
             g.rope(heads(xn, "k_proj", hk), cr, sr, d), axis=0)
    v = g.op("Concat", heads(cn, "v_proj", hk), heads(xn, "v_proj", hk), axis=0)
    x = g.op("Add", x, lin(g.attention(q, k, v, allowed, hq, hk, d), "self_attn.o_proj"))
    h = g.rms_norm(x, w("post_attention_layernorm"), cfg.rms_norm_eps)
    up = g.op("Mul", g.silu(lin(h, "mlp.gate_proj")), lin(h, "mlp.up_proj"))
    return g.op("Add", x, lin(up, "mlp.down_proj"))


def _heads(g: Graph, cfg, x: str, tensors: dict, fmt) -> tuple[str, str]:
    """Sequential heads: g_0 = x_0, g_j = x_j + U(silu(A x_j + B E[d_j])); argmax per row."""
    emb = g.op("Cast", g.tensor("draft_embed", tensors["draft_embed"]), to=TensorProto.FLOAT)
    norm = g.tensor("norm.weight", tensors["norm.weight"])
    lin = lambda v, n: g.linear(v, n, tensors, fmt(n))
    logits, idx = [], []
    for j in range(cfg.block_size):
        xj = g.slice(x, j, j + 1, 0)
        if j:
            e = g.op("Gather", emb, idx[-1], axis=0)
            inner = g.op("Add", lin(xj, "predecessor.A"), lin(e, "predecessor.B"))
            xj = g.op("Add", xj, lin(g.silu(inner), "predecessor.U"))
        lj = lin(g.rms_norm(xj, norm, cfg.rms_norm_eps), "lm_head")
        logits.append(lj)
        idx.append(g.op("ArgMax", lj, axis=1, keepdims=0, select_last_index=0))
    vocab = g.tensor("draft_vocab", tensors["draft_vocab"])
    ids = g.op("Gather", vocab, g.op("Concat", *idx, axis=0), axis=0)
    return ids, g.op("Concat", *logits, axis=0)


def drafter_graph(cfg, tensors: dict, formats: dict) -> onnx.ModelProto:  # noqa: F821
    """The one-pass drafter graph. tensors: engine-style tensors by name (+ "draft_embed"
    bf16 [Vd, H] and "draft_vocab" int64 [Vd]); formats: linear prefix -> "fp8" / "block_fp8"
    / "nvfp4" / None (bf16)."""
    g = Graph()
    fmt = formats.get
    ctx, x, last = _inputs(g, cfg, tensors, fmt)
    tables = _positions(g, cfg, last)
    for l in range(cfg.num_hidden_layers):
        x = _layer(g, cfg, l, x, ctx, tables, tensors, fmt)
    ids, logits = _heads(g, cfg, x, tensors, fmt)
    g.nodes.append(helper.make_node("Identity", [ids], ["draft_ids"]))
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("taps", f, ["N", cfg.num_taps,
                                                        cfg.target_hidden_size]),
              helper.make_tensor_value_info("next_token_embeds", f, ["N", cfg.hidden_size]),
              helper.make_tensor_value_info("anchor_position", TensorProto.INT64, [])]
    outputs = [helper.make_tensor_value_info("draft_ids", TensorProto.INT64, [cfg.block_size]),
               helper.make_tensor_value_info("logits", f, [cfg.block_size, "Vd"])]
    graph = helper.make_graph(g.nodes, "kolibri_block_drafter_pass", inputs, outputs,
                              initializer=g.inits)
    return helper.make_model(graph, ir_version=IR_VERSION, producer_name="kolibri_trt",
                             opset_imports=[helper.make_opsetid("", OPSET),
                                            helper.make_opsetid(DOMAIN, 1)])


def export_drafter_onnx(drafter, engine_tensors: dict, formats: dict, out_dir: Path
                        ) -> tuple[Path, Path]:
    """Write `drafter.onnx` (engine tensors, kolibri custom nodes) and `drafter_bf16.onnx`
    (the bf16 drafter) into `out_dir`. Returns both paths. Models over 1.8 GB keep their
    weights in external data files beside them."""
    import onnx

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = drafter.draft_vocab
    extra = {"draft_embed": drafter.target.embed_tokens[vocab].to(torch.bfloat16),
             "draft_vocab": vocab.long()}
    bf16 = {k: v.to(torch.bfloat16) for k, v in drafter.state_dict().items()}
    bf16["lm_head.weight"] = drafter.target.lm_head[vocab].to(torch.bfloat16)
    paths = []
    for name, tensors, fmts in (("drafter.onnx", engine_tensors, formats),
                                ("drafter_bf16.onnx", bf16, {})):
        model = drafter_graph(drafter.config, {**tensors, **extra}, fmts)
        path = out_dir / name
        big = model.ByteSize() > EXTERNAL_DATA_BYTES
        onnx.save_model(model, str(path), save_as_external_data=big,
                        location=f"{name}.data" if big else None)
        paths.append(path)
    return paths[0], paths[1]


def run_bf16(path: Path, taps: torch.Tensor, next_token_embeds: torch.Tensor, anchor: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `drafter_bf16.onnx` with onnxruntime on CPU: returns (draft_ids int64 [B],
    logits fp32 [B, Vd])."""
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids, logits = sess.run(["draft_ids", "logits"], {
        "taps": taps.float().numpy(), "next_token_embeds": next_token_embeds.float().numpy(),
        "anchor_position": np.array(anchor, dtype=np.int64)})
    return torch.from_numpy(ids), torch.from_numpy(logits)

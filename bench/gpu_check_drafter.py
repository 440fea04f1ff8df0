"""gpu_check sections ringattn, ropering, chainindex: the drafter's ring attention, RoPE + ring
write and chained-round index kernels (plugins/ring_attention.py, plugins/rope_ring_write.py,
plugins/chain_index.py) against their references over odd sizes, CUDA graph replay, one stream
alone vs in a batch. Run through bench/gpu_check.py."""

from __future__ import annotations

import gpu_check_base as B
import torch
from gpu_check_base import check_graph, record
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.chain_index import chain_index, chain_index_ref
from kolibri_trt_plugins.ring_attention import ring_attention, ring_attention_ref
from kolibri_trt_plugins.rope_ring_write import rope_ring_write, rope_ring_write_ref

RING_TOL = 2e-2   # P·V runs on bf16 probabilities in the kernel (fp32 in the reference)


def ring_case(S, Bk, hq, hkv, D, length, g, R=512, cw=200):
    """Ring of S + 2 slots (one the trash slot) x R rows holding positions 0.. (every 7th row
    empty), S streams in shuffled slots, block rows at the end of `length` rows."""
    dev = B.DEV
    slots_n = S + 1
    kv = T.randn((2, slots_n + 1, R, hkv, D), g, device=dev)
    pos_ring = torch.arange(R, device=dev).repeat(slots_n + 1, 1)
    pos_ring[:, ::7] = -1                                           # empty rows
    slots = torch.randperm(slots_n, generator=g)[:S].to(dev)
    anchors = torch.full((S,), length - Bk - 1, device=dev)
    pos = anchors[:, None] + torch.arange(Bk, device=dev)[None, :]
    q = T.randn((S, Bk, hq, D), g, device=dev)
    return q, kv, pos_ring, slots, anchors, pos.contiguous(), cw


def check_ring_attention(g, small):
    # L > SPLIT_ROWS (128) runs split programs and attn_combine: 300, 512, 1500 (12 splits)
    sizes = [(1, 4, 2, 2, 128, 37), (3, 4, 4, 2, 64, 300)] if small else [
        (1, 4, 2, 2, 128, 37), (3, 4, 4, 2, 64, 300), (8, 4, 20, 4, 128, 512), (1, 4, 8, 1, 128, 1),
        (2, 4, 2, 2, 128, 1500)]
    for S, Bk, hq, hkv, D, length in sizes:
        name = f"ring_attention S={S} B={Bk} Hq={hq} Hkv={hkv} D={D} L={length}"
        L = max(length, Bk + 1)
        args = ring_case(S, Bk, hq, hkv, D, L, g, R=max(512, L))
        out = ring_attention(*args, L)
        e = T.rel_err(out, ring_attention_ref(*args, L))
        msg = f"rel={e:.2e} " + check_graph(name, lambda: ring_attention(*args, L), out)
        record(name, e < RING_TOL, msg)
        if S > 1:
            q, kv, rp, slots, anchors, pos, cw = args
            one = ring_attention(q[1:2], kv, rp, slots[1:2], anchors[1:2], pos[1:2].contiguous(),
                                 cw, L)
            ok = torch.equal(one, out.view(S, -1)[1:2].reshape(one.shape))
            record(name + " stream alone vs batch", ok, "bit-identical" if ok else "DIFFERS")


def check_rope_ring_write(g, small):
    for T_, hq, hkv, D in [(1, 2, 2, 128), (17, 4, 2, 64), (33, 0, 2, 128)] + (
            [] if small else [(64, 20, 4, 128)]):
        name = f"rope_ring_write T={T_} Hq={hq} Hkv={hkv} D={D}"
        qkv = T.randn((T_, (hq + 2 * hkv) * D), g, device=B.DEV)
        ang = torch.rand((T_, D // 2), generator=g).to(B.DEV) * 6.0
        m = torch.stack([torch.cos(ang), -torch.sin(ang), torch.sin(ang), torch.cos(ang)], 1)
        m = m.view(T_, 2, 2, D // 2).contiguous()
        kv0 = torch.zeros((2, 5, 64, hkv, D), dtype=torch.bfloat16, device=B.DEV)
        flat = torch.randperm(4 * 64, generator=g)[:T_].to(B.DEV)
        slots, rows = flat // 64, flat % 64
        q1, kv1 = qkv.clone(), kv0.clone()
        rope_ring_write(q1, m, kv1, slots, rows, hq)
        q2, kv2 = qkv.clone(), kv0.clone()
        rope_ring_write_ref(q2, m, kv2, slots, rows, hq)
        ok = torch.equal(q1, q2) and torch.equal(kv1, kv2)
        q3, kv3 = qkv.clone(), kv0.clone()
        msg = check_graph(name, lambda: (q3.copy_(qkv), rope_ring_write(q3, m, kv3, slots, rows,
                                                                         hq), q3)[2], q1)
        record(name, ok, f"bit-identical to the reference: {ok} " + msg)


def check_chain_index(g, small):
    """Exact (integer maths): the kernel against the reference on random steps (each stream's
    drafts accepted 0 .. k times, streams starting at position 0 among them: negative
    remainders), eager and in a CUDA graph replayed twice."""
    for s_valid, s_b, width, depth, b in [(1, 1, 5, 1, 4), (3, 4, 5, 1, 4), (6, 8, 9, 2, 4)] + (
            [] if small else [(50, 64, 5, 1, 4), (0, 2, 3, 2, 3)]):
        name = f"chain_index S={s_valid}/{s_b} width={width} depth={depth} B={b}"
        rows = torch.randint(0, width, (s_b,), generator=g)
        row0 = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), 1 + rows[:-1]]), 0)
        t = int(row0[-1] + 1 + rows[-1]) + 3
        fields = torch.zeros(5, s_b, dtype=torch.long)
        fields[0], fields[1] = row0, rows
        fields[2] = torch.randint(0, 4000, (s_b,), generator=g)
        fields[2, ::3] = 0
        fields[3] = torch.randperm(s_b, generator=g)
        fields[4, :s_valid] = 1
        inputs = torch.randint(0, 3, (t + 2,), generator=g)       # many equal: long accepts
        own = torch.randint(0, 3, (t,), generator=g)
        offsets = torch.arange(depth * b).view(depth, b)
        n_b = max(8, 1 << (s_b * width - 1).bit_length())
        dev = [x.to(B.DEV) for x in (fields, inputs, own, offsets)]
        r0 = torch.full((6, depth * s_b * b + 3), -7, dtype=torch.long, device=B.DEV)
        c0 = torch.full((6, n_b + 3), -7, dtype=torch.long, device=B.DEV)
        args = dict(s_b=s_b, n_b=n_b, width=width, ring_size=2069, history_rows=2065, trash=9)
        r_ref, c_ref = r0.cpu(), c0.cpu()
        chain_index_ref(fields, inputs, own, offsets, r_ref, c_ref, **args)
        r1, c1 = r0.clone(), c0.clone()
        chain_index(*dev, r1, c1, **args)
        ok = torch.equal(r1.cpu(), r_ref) and torch.equal(c1.cpu(), c_ref)
        r2, c2 = r0.clone(), c0.clone()
        msg = check_graph(name, lambda: (chain_index(*dev, r2, c2, **args), r2, c2)[1:], [r1, c1])
        record(name, ok, f"equal to the reference: {ok} " + msg)

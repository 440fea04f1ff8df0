"""Paged attention over the INT4 and FP8 caches, and the split-KV merge."""

import importlib
import math

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.attn_combine import attn_combine, attn_combine_ref
from kolibri_trt_plugins.fp8_paged_attention import fp8_paged_attention, fp8_paged_attention_ref
from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention, int4_paged_attention_ref
from kolibri_trt_plugins.qk_norm_fold_int4 import dequantize_int4_ref

REF_TOL = 1e-2     # bf16 output (2^-9 per element) of fp32 maths done in another order
INTERP_TOL = 2e-2  # + fp16 P·V operands and the interpreter's truncating bf16 store
SEQS, QLENS = [1, 3, 33, 75], [1, 3, 2, 9]   # odd lengths, ragged verification (1 + k, k <= 8)


def dense_ref(q, k, v, seq_lens, q_lens, window, sm_scale):
    """Independent float64 attention over contiguous per-stream K/V lists (GQA by n // G)."""
    out, t0 = [], 0
    for s, (L, ql) in enumerate(zip(seq_lens, q_lens)):
        g = q.shape[1] // k[s].shape[1]
        for t in range(ql):
            i = L - ql + t
            lo = max(0, i - window + 1) if window else 0
            for h in range(q.shape[1]):
                kk, vv = k[s][lo:i + 1, h // g].double(), v[s][lo:i + 1, h // g].double()
                p = torch.softmax(kk @ q[t0 + t, h].double() * sm_scale, 0)
                out.append(p @ vv)
        t0 += ql
    return torch.stack(out).view(q.shape)


def contiguous_kv(cache_k, cache_v, bt, seqs, blk, deq):
    ks, vs = [], []
    for s, L in enumerate(seqs):
        pos = torch.arange(L)
        slots = bt[s, pos // blk].long() * blk + pos % blk
        ks.append(deq(cache_k, slots))
        vs.append(deq(cache_v, slots))
    return ks, vs


def int4_case(blk, seed, hq=4, hkv=2):
    g = T.gen(seed)
    bt, sl, cu, nb = T.paged_layout(SEQS, QLENS, blk, g)
    cache = T.int4_cache(nb, blk, hkv, g)
    q = T.randn((sum(QLENS), hq, 128), g)
    return q, cache, bt, sl, cu


@pytest.mark.parametrize("blk", [16, 64])
@pytest.mark.parametrize("window", [0, 20])
def test_int4_reference_against_dense(blk, window):
    q, (kc, vc, km, vm), bt, sl, cu = int4_case(blk, blk + window)
    hkv = kc.shape[1]

    def d4(codes, slots, meta):   # head-major pages: [block, head, offset]
        b, o = slots // blk, slots % blk
        return dequantize_int4_ref(codes[b, :, o], meta[b, :, o])
    ks = [d4(kc, bt[s, torch.arange(L) // blk].long() * blk + torch.arange(L) % blk, km)
          for s, L in enumerate(SEQS)]
    vs = [d4(vc.transpose(2, 3), bt[s, torch.arange(L) // blk].long() * blk  # dim-major pages
             + torch.arange(L) % blk, vm) for s, L in enumerate(SEQS)]
    ref = dense_ref(q, ks, vs, SEQS, QLENS, window, 1 / math.sqrt(128))
    out = int4_paged_attention(q, kc, vc, km, vm, bt, sl, cu, max(SEQS), max(QLENS), window=window)
    assert T.rel_err(out, ref) < REF_TOL


@pytest.mark.parametrize("window", [0, 513, 20])
def test_fp8_reference_against_dense(window):
    g = T.gen(7 + window)
    blk, hkv = 16, 2
    bt, sl, cu, nb = T.paged_layout(SEQS, QLENS, blk, g)
    kf, vf = T.fp8_cache(nb, blk, hkv, g)
    ks_, vs_ = torch.tensor([0.5]), torch.tensor(2.0)
    q = T.randn((sum(QLENS), 4, 128), g)

    def deq(cache, slots):
        return cache.view(-1, hkv, 128)[slots].float()
    ks, vs = contiguous_kv(kf, vf, bt, SEQS, blk, deq)
    ks = [k * 0.5 for k in ks]
    vs = [v * 2.0 for v in vs]
    ref = dense_ref(q, ks, vs, SEQS, QLENS, window, 1 / math.sqrt(128))
    out = fp8_paged_attention(q, kf, vf, ks_, vs_, bt, sl, cu, max(SEQS), max(QLENS), window=window)
    assert T.rel_err(out, ref) < REF_TOL


def test_window_never_reads_outside():
    """Blocks wholly outside every query's window hold NaN (a reused ring block): no NaN leaks."""
    g = T.gen(3)
    blk, hkv, W = 16, 2, 20
    seqs, qls = [75, 70], [2, 1]
    bt, sl, cu, nb = T.paged_layout(seqs, qls, blk, g)
    kf, vf = T.fp8_cache(nb, blk, hkv, g)
    for s, (L, ql) in enumerate(zip(seqs, qls)):
        lo = L - ql - W + 1
        for b in range(lo // blk):  # logical blocks entirely before the first visible key
            kf.view(torch.uint8)[bt[s, b]] = 0x7F  # e4m3 NaN
            vf.view(torch.uint8)[bt[s, b]] = 0x7F
    q = T.randn((sum(qls), 4, 128), g)
    one = torch.ones(1)
    out = fp8_paged_attention(q, kf, vf, one, one, bt, sl, cu, 75, 2, window=W)
    assert torch.isfinite(out.float()).all()


def test_int4_interpreter_matches_reference(interp):
    for blk in (16, 64):
        q, cache, bt, sl, cu = int4_case(blk, 40 + blk)
        for window in (0, 20):
            ref = int4_paged_attention_ref(q, *cache, bt, sl, cu, 1 / math.sqrt(128), window)
            out = int4_paged_attention(q, *cache, bt, sl, cu, max(SEQS), max(QLENS), window=window,
                                       part=128, interpret=True)
            assert T.rel_err(out, ref) < INTERP_TOL, (blk, window)


def _int4_interp(q, cache, bt, sl, cu, window, **flags):
    """int4_paged_attention in the interpreter with module flags (e.g. MASK_FREE) set."""
    ia = importlib.import_module("kolibri_trt_plugins.int4_paged_attention")
    saved = {k: getattr(ia, k) for k in flags}
    try:
        for k, v in flags.items():
            setattr(ia, k, v)
        return int4_paged_attention(q, *cache, bt, sl, cu, max(SEQS), max(QLENS), window=window,
                                    part=128, interpret=True)
    finally:
        for k, v in saved.items():
            setattr(ia, k, v)


def test_int4_mask_free_tiles_same_bits(interp):
    """Tiles every row sees run without the mask: the same bits as masking them (the mask is
    all true there). SEQS/QLENS put the split inside the partition for decode and verification."""
    for blk in (16, 64):
        q, cache, bt, sl, cu = int4_case(blk, 60 + blk)
        a = _int4_interp(q, cache, bt, sl, cu, 0, MASK_FREE=True)
        b = _int4_interp(q, cache, bt, sl, cu, 0, MASK_FREE=False)
        assert torch.equal(a, b), blk


def test_int4_key_pieces_same_bits(interp):
    """Keys of pages shorter than the tile loaded per page piece (K_PIECES) or per key: the
    same bytes reach the same maths, so the same bits (16-token pages, the only size under
    the 32-key tile; decode and verification, full causal and windowed)."""
    q, cache, bt, sl, cu = int4_case(16, 81)
    for window in (0, 20):
        a = _int4_interp(q, cache, bt, sl, cu, window, K_PIECES=True)
        b = _int4_interp(q, cache, bt, sl, cu, window, K_PIECES=False)
        assert torch.equal(a, b), window
        ref = int4_paged_attention_ref(q, *cache, bt, sl, cu, 1 / math.sqrt(128), window)
        assert T.rel_err(a, ref) < INTERP_TOL, window


@pytest.mark.parametrize("defer", [False, True])
def test_int4_column_sums_each_mode(interp, defer):
    """DEFER_SUMS False (sums per tile) and True (per key group, reduced once) both match the
    reference, decode and verification, full causal and windowed."""
    q, cache, bt, sl, cu = int4_case(16, 70 + defer)
    for window in (0, 20):
        ref = int4_paged_attention_ref(q, *cache, bt, sl, cu, 1 / math.sqrt(128), window)
        out = _int4_interp(q, cache, bt, sl, cu, window, DEFER_SUMS=defer)
        assert T.rel_err(out, ref) < INTERP_TOL, (defer, window)


def test_int4_decode_rows_of_a_gqa_group(interp):
    """Decode at Kolibri's GQA 5 (10 query heads over 2 KV heads) takes 8-row programs, 1 + 3
    tokens 16-row ones (20 rows: two tiles): both match the reference."""
    g = T.gen(61)
    seqs = [5, 40, 71]
    for qlens in ([1, 1, 1], [1, 4, 2]):
        bt, sl, cu, nb = T.paged_layout(seqs, qlens, 16, g)
        cache = T.int4_cache(nb, 16, 2, g)
        q = T.randn((sum(qlens), 10, 128), g)
        ref = int4_paged_attention_ref(q, *cache, bt, sl, cu, 1 / math.sqrt(128))
        out = int4_paged_attention(q, *cache, bt, sl, cu, max(seqs), max(qlens), part=32,
                                   interpret=True)
        assert T.rel_err(out, ref) < INTERP_TOL, qlens


def test_int4_verify_rows_per_program_same_bits(interp_f64_dots):
    """Verification rows in 32-row programs (ROWS_MAX 32: 1 + 3 tokens x GQA 5 in one program)
    give the bits of 16-row ones: each row's sums run in the same order whatever the tile
    (the interpreter's dots in float64: its fp32 matmul's order follows the CPU's BLAS)."""
    g = T.gen(62)
    seqs, qlens = [5, 40, 71], [1, 4, 2]
    bt, sl, cu, nb = T.paged_layout(seqs, qlens, 16, g)
    cache = T.int4_cache(nb, 16, 2, g)
    q = T.randn((sum(qlens), 10, 128), g)
    ia = importlib.import_module("kolibri_trt_plugins.int4_paged_attention")
    outs = []
    for rows in (16, 32):
        saved, ia.ROWS_MAX = ia.ROWS_MAX, rows
        try:
            outs.append(int4_paged_attention(q, *cache, bt, sl, cu, max(seqs), max(qlens),
                                             part=32, interpret=True))
        finally:
            ia.ROWS_MAX = saved
    assert torch.equal(outs[0], outs[1])


def _fp8_interp_against_ref(seed, seqs, qlens, hq, windows, **kw):
    """fp8_paged_attention in the interpreter against its fp32 reference, 16- and 64-token
    pages, each window; kw: the wrapper's options (part)."""
    g = T.gen(seed)
    for blk in (16, 64):
        bt, sl, cu, nb = T.paged_layout(seqs, qlens, blk, g)
        kf, vf = T.fp8_cache(nb, blk, 2, g)
        q = T.randn((sum(qlens), hq, 128), g)
        s1, s2 = torch.tensor([0.7]), torch.tensor([1.3])
        for window in windows:
            ref = fp8_paged_attention_ref(q, kf, vf, s1, s2, bt, sl, cu, 1 / math.sqrt(128), window)
            out = fp8_paged_attention(q, kf, vf, s1, s2, bt, sl, cu, max(seqs), max(qlens),
                                      window=window, interpret=True, **kw)
            assert T.rel_err(out, ref) < INTERP_TOL, (blk, window)


def test_fp8_interpreter_matches_reference(interp):
    _fp8_interp_against_ref(5, SEQS, QLENS, 4, (0, 20), part=64)


@pytest.mark.parametrize("block_n", [32, 128])
def test_fp8_single_split_matches_reference(interp, monkeypatch, block_n):
    """SINGLE_SPLIT (one program over the whole window, output normalised in the launch):
    ragged decode and verification over 16- and 64-token pages against the fp32 reference."""
    fa = importlib.import_module("kolibri_trt_plugins.fp8_paged_attention")
    monkeypatch.setattr(fa, "SINGLE_SPLIT", True)
    monkeypatch.setattr(fa, "BLOCK_N", block_n)
    monkeypatch.setattr(fa, "PART", max(block_n, fa.PART))   # unused by SINGLE, checked
    _fp8_interp_against_ref(71, [1, 3, 33, 75, 140], [1, 3, 2, 9, 1], 10, (20, 513))


def test_fp8_single_split_rows_depend_on_their_stream_alone(interp_f64_dots, monkeypatch):
    """SINGLE_SPLIT's batch invariance: a stream's rows alone == in a batch of others, and its
    decode row at position L - 1 == the last row of a verification ending there (its tiles
    start at its own first visible key; the leading all-masked tiles leave the state as is)."""
    fa = importlib.import_module("kolibri_trt_plugins.fp8_paged_attention")
    monkeypatch.setattr(fa, "SINGLE_SPLIT", True)
    g = T.gen(72)
    window, blk = 20, 16
    seqs, qlens = [7, 61, 90], [1, 4, 1]
    bt, sl, cu, nb = T.paged_layout(seqs, qlens, blk, g)
    kf, vf = T.fp8_cache(nb, blk, 2, g)
    q = T.randn((sum(qlens), 10, 128), g)
    one = torch.tensor([1.0])
    full = fp8_paged_attention(q, kf, vf, one, one, bt, sl, cu, 90, 4, window=window,
                               interpret=True)
    # stream 1 alone, as a decode of its last token (position 60: the same keys)
    cu1 = torch.tensor([0, 1], dtype=torch.int32)
    last = fp8_paged_attention(q[4:5], kf, vf, one, one, bt[1:2], sl[1:2], cu1, 61, 1,
                               window=window, interpret=True)
    assert torch.equal(last[0], full[4])
    alone = fp8_paged_attention(q[5:6], kf, vf, one, one, bt[2:3], sl[2:3], cu1, 90, 1,
                                window=window, interpret=True)
    assert torch.equal(alone[0], full[5])


def test_combine_interpreter_and_empty_splits(interp):
    g = T.gen(9)
    m = torch.randn((5, 7), generator=g)
    m[:, 3] = float("-inf")   # an empty split: its l/acc are garbage and must not be read
    m[4, :] = float("-inf")   # a row with no key at all -> zeros
    l = torch.rand((5, 7), generator=g) + 0.5
    acc = torch.randn((5, 7, 128), generator=g)
    acc[:, 3] = float("nan")
    ref = attn_combine_ref(m, l, acc)
    out = attn_combine(m, l, acc, interpret=True)
    assert torch.isfinite(out.float()).all() and torch.all(out[4] == 0)
    assert T.rel_err(out[:4], ref[:4]) < INTERP_TOL


def test_errors_name_the_argument():
    q, (kc, vc, km, vm), bt, sl, cu = int4_case(16, 1)
    with pytest.raises(ValueError, match="^block_tables:"):
        int4_paged_attention(q, kc, vc, km, vm, bt.long(), sl, cu, 75, 9)
    with pytest.raises(ValueError, match="^v_meta:"):
        int4_paged_attention(q, kc, vc, km, vm.float(), bt, sl, cu, 75, 9)
    with pytest.raises(ValueError, match="^block_tables:"):  # cannot hold max_seq_len
        int4_paged_attention(q, kc, vc, km, vm, bt, sl, cu, 10_000, 9)
    with pytest.raises(ValueError, match="^q:"):
        int4_paged_attention(q.float(), kc, vc, km, vm, bt, sl, cu, 75, 9)
    kf = torch.zeros((kc.shape[0], 16, 2, 128), dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="^k_scale:"):
        fp8_paged_attention(q, kf, kf, torch.ones(2), torch.ones(1), bt, sl, cu, 75, 9, window=513)
    with pytest.raises(ValueError, match="^window:"):
        fp8_paged_attention(q, kf, kf, torch.ones(1), torch.ones(1), bt, sl, cu, 75, 9, window=-1)
    # PART must be a multiple of the layer kind's key tile: 64 (sliding), 32 (full causal)
    one = torch.ones(1)
    with pytest.raises(ValueError, match="^part: 96 must be a positive multiple of 64"):
        fp8_paged_attention(q, kf, kf, one, one, bt, sl, cu, 75, 9, window=513, part=96)
    fp8_paged_attention(q, kf, kf, one, one, bt, sl, cu, 75, 9, window=0, part=96)
    with pytest.raises(ValueError, match="^part: 48 must be a positive multiple of 32"):
        fp8_paged_attention(q, kf, kf, one, one, bt, sl, cu, 75, 9, window=0, part=48)

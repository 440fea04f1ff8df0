"""NVFP4 and FP8 (per-tensor, per-channel, block 1x64) weight-only GEMMs for small batches."""

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.fp8_gemv import Fusion, fp8_dequantize_ref, fp8_gemv, fp8_gemv_ref
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_dequantize_ref, nvfp4_gemv, nvfp4_gemv_ref

INTERP_TOL = 1.5e-2  # bf16 output; the interpreter's bf16 store truncates; block-FP8 rounds w·s to bf16
SHAPES = [(1, 1, 64), (3, 33, 256), (33, 17, 272), (65, 3, 64)]  # (M, N, K): odd M, N; K % 16 == 0


def test_nvfp4_dequant_against_bit_decode():
    """Independent e2m1 decode from the bits: sign bit 3, exponent bits 2-1, mantissa bit 0."""
    w = torch.arange(256, dtype=torch.uint8).repeat(2, 4)  # every byte, [2, 1024]: K = 2048
    ws = torch.full((2, 128), 2.0).to(torch.float8_e4m3fn)
    got = nvfp4_dequantize_ref(w, ws, torch.tensor(0.5))

    def e2m1(c):
        sgn = -1.0 if c & 8 else 1.0
        e, m = (c >> 1) & 3, c & 1
        return sgn * (m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2))
    want = torch.tensor([[e2m1(int(b) & 15), e2m1(int(b) >> 4)] for b in w[0]]).flatten()
    assert torch.equal(got[0], want * 2.0 * 0.5)


def test_fp8_dequant_layouts():
    w = torch.randn(4, 128).to(torch.float8_e4m3fn)
    assert torch.equal(fp8_dequantize_ref(w, torch.tensor([2.0])), w.float() * 2)
    ch = torch.arange(1, 5).float()
    assert torch.equal(fp8_dequantize_ref(w, ch), w.float() * ch[:, None])
    blk = torch.tensor([[1.0, 3.0]]).repeat(4, 1)
    deq = fp8_dequantize_ref(w, blk)
    assert torch.equal(deq[:, :64], w.float()[:, :64]) and torch.equal(deq[:, 64:], 3 * w.float()[:, 64:])


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_nvfp4_interpreter(interp, M, N, K):
    g = T.gen(M * 1000 + N)
    x = T.randn((M, K), g)
    w = T.nvfp4_weight(N, K, g)
    assert T.rel_err(nvfp4_gemv(x, *w, interpret=True), nvfp4_gemv_ref(x, *w)) < INTERP_TOL


@pytest.mark.parametrize("max_tiles", [1, 2])
def test_nvfp4_row_tiles_keep_bits(interp, monkeypatch, max_tiles):
    """Fewer row tiles per program only move work between programs: the output bits equal
    the defaults' (33 rows: three tiles, one partial; 72 outputs: five 16-wide N tiles)."""
    import importlib
    nv = importlib.import_module("kolibri_trt_plugins.nvfp4_gemv")
    g = T.gen(77)
    x = T.randn((33, 64), g)
    w = T.nvfp4_weight(72, 64, g)
    want = nvfp4_gemv(x, *w, interpret=True)
    monkeypatch.setattr(nv, "MAX_TILES", max_tiles)
    assert torch.equal(nvfp4_gemv(x, *w, interpret=True), want)


@pytest.mark.parametrize("swap_rows", [0, 144])
@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
@pytest.mark.parametrize("M,N,K", SHAPES + [(5, 7, 33)])
def test_fp8_interpreter(interp, monkeypatch, mode, M, N, K, swap_rows):
    """Both operand orders: fp8_gemv.SWAP_ROWS 144 (the default) takes M <= 144 as W·x^T, 0
    never."""
    if mode == "block" and K % 64:
        pytest.skip("block scales need K % 64 == 0")
    import importlib
    monkeypatch.setattr(importlib.import_module("kolibri_trt_plugins.fp8_gemv"), "SWAP_ROWS",
                        swap_rows)
    g = T.gen(M * 1000 + N + K)
    x = T.randn((M, K), g)
    w = T.fp8_weight(N, K, mode, g)
    assert T.rel_err(fp8_gemv(x, *w, interpret=True), fp8_gemv_ref(x, *w)) < INTERP_TOL


@pytest.mark.parametrize("wide", [(32, 4), (64, 2)])
def test_fp8_wide_tiles_keep_bits(interp, monkeypatch, wide):
    """fp8_gemv.WIDE_TILES (past SWAP_ROWS rows, plain per-tensor) only regroups output columns
    and row tiles: the bits equal 16-wide single-tile programs' (33 rows: three row tiles, one
    partial; 72 outputs)."""
    import importlib
    f8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
    g = T.gen(78)
    x = T.randn((33, 256), g)
    w = T.fp8_weight(72, 256, "tensor", g)
    monkeypatch.setattr(f8, "SWAP_ROWS", 0)   # 33 rows take the 16-row form
    monkeypatch.setattr(f8, "WIDE_TILES", (16, 1))
    want = fp8_gemv(x, *w, interpret=True)
    monkeypatch.setattr(f8, "WIDE_TILES", wide)
    assert torch.equal(fp8_gemv(x, *w, interpret=True), want)


def _swap_cases(g):
    """(module, op, weight) of the swapped GEMVs: fp8_gemv per tensor and with block scales,
    nvfp4_gemv; 72 x 256 weights."""
    import importlib
    f8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
    nv = importlib.import_module("kolibri_trt_plugins.nvfp4_gemv")
    cases = [(f8, fp8_gemv, T.fp8_weight(72, 256, mode, g)) for mode in ("tensor", "block")]
    return cases + [(nv, nvfp4_gemv, T.nvfp4_weight(72, 256, g))]


@pytest.mark.parametrize("M", [1, 3, 8])
def test_swapped_form_keeps_bits(interp, monkeypatch, M):
    """W·x^T (SWAP_ROWS, up to 8 rows) gives the bits of the 16-row x·W^T form: the same
    products per MMA k-step (the H200 shows the same, bench/swap_ab.py)."""
    g = T.gen(90 + M)
    x = T.randn((M, 256), g)
    for mod, fn, w in _swap_cases(g):
        monkeypatch.setattr(mod, "SWAP_ROWS", 0)
        want = fn(x, *w, interpret=True)
        monkeypatch.setattr(mod, "SWAP_ROWS", 8)
        assert torch.equal(fn(x, *w, interpret=True), want), mod.__name__


@pytest.mark.parametrize("M,rows", [(20, 16), (33, 32), (33, 16), (70, 16)])
def test_wide_swapped_tiles_keep_bits(interp_f64_dots, monkeypatch, M, rows):
    """fp8_gemv's swapped form past 8 rows (SWAP_ROWS 144, 16- or 32-row tiles: one row tile
    per program, several programs along M; the default, timed by bench/wide_swap.py) gives the
    16-row form's bits (SWAP_ROWS 0), as on the H200. (nvfp4_gemv's wide swapped tiles gave
    other bits there, and were slower: bench/results/h200-2026-12-01e/od/; not used.)"""
    g = T.gen(95 + M)
    x = T.randn((M, 256), g)
    for mod, fn, w in _swap_cases(g)[:2]:
        monkeypatch.setattr(mod, "SWAP_ROWS", 0)
        want = fn(x, *w, interpret=True)
        monkeypatch.setattr(mod, "SWAP_ROWS", 144)
        monkeypatch.setattr(mod, "SWAP_TILES", ((144, rows, 1, 3),))
        assert torch.equal(fn(x, *w, interpret=True), want), mod.__name__


def test_fp8_swap_tile_by_rows():
    """fp8_gemv's swapped tiles by M (SWAP_TILES): 8 rows up to 8, 16 up to 32, 32 up to 64,
    16 up to 144."""
    import importlib
    f8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
    ms = (1, 8, 9, 32, 33, 64, 65, 144)
    assert [f8.swap_tile(m)[0] for m in ms] == [8, 8, 16, 16, 32, 32, 16, 16]
    assert f8.swap_tile(20)[1] == dict(num_warps=1, num_stages=3)


def test_fp8_swapped_by_rows_and_form():
    """fp8_gemv takes W·x^T up to SWAP_ROWS rows, except with a norm and, for plain per-tensor
    GEMVs, at WIDE_ROWS (128: two full 64-row groups of WIDE_TILES); block scales swap there."""
    import importlib
    f8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
    from kolibri_trt_plugins._gemv_fusion import NO_FUSION, Fusion
    tensor, block = f8.MODE_TENSOR, f8.MODE_BLOCK
    assert [f8.swapped(m, NO_FUSION, tensor) for m in (1, 64, 127, 128, 144, 145)] == [
        True, True, True, False, True, False]
    assert f8.swapped(128, NO_FUSION, block)
    normed = Fusion(norm=torch.ones(4), norm_segments=1)
    assert not f8.swapped(1, normed, tensor)


def test_unknown_decode_mode_raises(monkeypatch):
    """A DECODE setting the kernels do not have raises, naming the module (no silent fallback)."""
    import importlib
    g = T.gen(3)
    x = T.randn((2, 64), g)
    for name, fn, w in (("fp8_gemv", fp8_gemv, T.fp8_weight(8, 64, "tensor", g)),
                        ("nvfp4_gemv", nvfp4_gemv, T.nvfp4_weight(8, 64, g))):
        monkeypatch.setattr(importlib.import_module(f"kolibri_trt_plugins.{name}"), "DECODE", 2)
        with pytest.raises(ValueError, match=f"^{name}.DECODE"):
            fn(x, *w, interpret=True)


def test_row_stride_and_cpu_path():
    g = T.gen(1)
    x = T.randn((4, 128), g)[:, :64]  # row stride 128, last dim contiguous
    w = T.fp8_weight(9, 64, "channel", g)
    assert torch.equal(fp8_gemv(x, *w), fp8_gemv_ref(x, *w))


def test_errors_name_the_argument():
    g = T.gen(2)
    x = T.randn((2, 64), g)
    w, ws, gs = T.nvfp4_weight(8, 64, g)
    with pytest.raises(ValueError, match="^x:"):
        nvfp4_gemv(T.randn((2, 40), g), w, ws, gs)
    with pytest.raises(ValueError, match="^weight_scale:"):
        nvfp4_gemv(x, w, ws.float(), gs)
    with pytest.raises(ValueError, match="^weight_scale_2:"):
        nvfp4_gemv(x, w, ws, torch.ones(2))
    w8, s8 = T.fp8_weight(8, 64, "tensor", g)
    with pytest.raises(ValueError, match="^weight:"):
        fp8_gemv(x, w8.float(), s8)
    with pytest.raises(ValueError, match="^weight_scale:"):
        fp8_gemv(x, w8, torch.ones(3))
    with pytest.raises(ValueError, match="^x:"):
        fp8_gemv(x.t(), w8, s8)


FUSED_TOL = 8e-3  # round-to-nearest casts (interp_rne); fp32 sum order moves a bf16 ulp (2^-8)
FUSED = [dict(norm=True), dict(act="silu"), dict(act="swiglu"), dict(residual=True),
         dict(residual=True, act="silu"), dict(norm=True, act="swiglu"),
         dict(norm=True, residual=True)]


def _fused_args(opts, M, N, K, g):
    """The fused keyword arguments of `opts` (True -> a tensor) for an [M, K] x, N weight rows."""
    out = {"act": opts.get("act", "none")}
    if opts.get("norm"):
        out["norm"] = (1 + 0.5 * T.randn((K,), g).float()).to(torch.bfloat16)
    if opts.get("residual"):
        out["residual"] = T.randn((M, N), g)
    return out


@pytest.mark.parametrize("opts", FUSED, ids=lambda o: "+".join(sorted(o)) + "-" + o.get("act", ""))
@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("M,N,K", [(1, 34, 64), (3, 18, 320), (33, 66, 256)])
def test_fp8_fused_interpreter(interp_rne, monkeypatch, opts, split, M, N, K):
    """norm prologue, residual / silu / swiglu epilogues, also through the split-K reduce."""
    import importlib
    mod = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
    monkeypatch.setattr(mod, "SPLIT_K", split)
    g = T.gen(M * 100 + N + K + split)
    x = T.randn((M, K), g)
    w = T.fp8_weight(N, K, "block", g)
    kw = _fused_args(opts, M, N, K, g)
    got = fp8_gemv(x, *w, interpret=True, **kw)
    want = fp8_gemv_ref(x, *w, Fusion(**kw))
    assert got.shape == want.shape == (M, N // 2 if kw["act"] == "swiglu" else N)
    assert T.rel_err(got, want) < FUSED_TOL


@pytest.mark.parametrize("M,N,K", [(1, 33, 64), (4, 70, 256), (17, 9, 320)])
def test_nvfp4_norm_interpreter(interp_rne, M, N, K):
    """nvfp4_gemv's RMSNorm prologue (the drafter's final norm before its head) vs
    add_rms_norm_ref then the product; the CPU path is that composition exactly."""
    from kolibri_trt_plugins.add_rms_norm import add_rms_norm_ref
    g = T.gen(M + N + K)
    x = T.randn((M, K), g) * 3
    w = T.nvfp4_weight(N, K, g)
    gain = (1 + 0.5 * T.randn((K,), g).float()).to(torch.bfloat16)
    want = nvfp4_gemv_ref(x, *w, norm=gain)
    assert torch.equal(want, nvfp4_gemv_ref(add_rms_norm_ref(x, None, gain, 1e-6)[1], *w))
    assert T.rel_err(nvfp4_gemv(x, *w, interpret=True, norm=gain), want) < FUSED_TOL
    assert torch.equal(nvfp4_gemv(x, *w, norm=gain), want)
    with pytest.raises(ValueError, match="^norm:"):
        nvfp4_gemv(x, *w, norm=gain.float())


@pytest.mark.parametrize("segs,K", [(3, 192), (3, 768), (2, 320)])
@pytest.mark.parametrize("split", [1, 2])
def test_fp8_segment_norm_interpreter(interp_rne, monkeypatch, segs, K, split):
    """norm_segments: each K/S-column segment normalised over itself (the drafter's taps),
    segments inside one K step (192: 3 x 64) and across steps (768: 3 x 256)."""
    import importlib
    monkeypatch.setattr(importlib.import_module("kolibri_trt_plugins.fp8_gemv"), "SPLIT_K", split)
    g = T.gen(K + segs)
    x = T.randn((5, K), g) * torch.linspace(0.1, 4.0, K).to(torch.bfloat16)  # segments differ
    w = T.fp8_weight(24, K, "block", g)
    gain = (1 + 0.5 * T.randn((K,), g).float()).to(torch.bfloat16)
    got = fp8_gemv(x, *w, interpret=True, norm=gain, norm_segments=segs)
    want = fp8_gemv_ref(x, *w, Fusion(norm=gain, norm_segments=segs))
    assert T.rel_err(got, want) < FUSED_TOL
    whole = fp8_gemv_ref(x, *w, Fusion(norm=gain))  # one norm over all of K: a different result
    assert T.rel_err(whole, want) > 10 * FUSED_TOL


@pytest.mark.parametrize("opts", [{}, dict(norm=True, act="silu")])
def test_fp8_x_rows_gather_interpreter(interp_rne, opts):
    """x_rows: output row m reads table row ids[m] (strided ids, repeats, M > table rows)."""
    g = T.gen(11)
    table = T.randn((7, 128), g)
    ids = torch.tensor([[3, 0], [3, 1], [6, 2], [0, 5], [6, 6], [2, 1], [1, 4], [5, 3],
                        [4, 0]])[:, 0]                       # stride 2
    w = T.fp8_weight(40, 128, "block", g)
    kw = _fused_args(opts, len(ids), 40, 128, g)
    got = fp8_gemv(table, *w, interpret=True, x_rows=ids, **kw)
    want = fp8_gemv_ref(table.index_select(0, ids), *w, Fusion(**kw))
    assert got.shape == (9, 40) and T.rel_err(got, want) < FUSED_TOL
    assert torch.equal(fp8_gemv(table, *w, x_rows=ids, **kw), want)   # the CPU path


def test_fp8_fused_ref_is_the_torch_composition():
    """The reference (the CPU path) is exactly the ops it replaces: add_rms_norm_ref, the
    product, bf16 add, F.silu / F.silu(gate) * up over interleaved rows."""
    from kolibri_trt_plugins.add_rms_norm import add_rms_norm_ref
    from kolibri_trt_plugins.fp8_gemv import interleave_rows
    g = T.gen(5)
    x, r = T.randn((4, 128), g), T.randn((4, 16), g)
    gain = T.randn((128,), g)
    wg, sg = T.fp8_weight(16, 128, "block", g)
    wu, su = T.fp8_weight(16, 128, "block", g)
    normed = add_rms_norm_ref(x, None, gain, 1e-6)[1]
    assert torch.equal(fp8_gemv(x, wg, sg, norm=gain, residual=r, act="silu"),
                       torch.nn.functional.silu(fp8_gemv_ref(normed, wg, sg) + r))
    w13 = interleave_rows(wg.view(torch.uint8), wu.view(torch.uint8)).view(torch.float8_e4m3fn)
    got = fp8_gemv(x, w13, interleave_rows(sg, su), act="swiglu")
    assert torch.equal(got, torch.nn.functional.silu(fp8_gemv(x, wg, sg)) * fp8_gemv(x, wu, su))


def test_fp8_fused_errors_name_the_argument():
    g = T.gen(3)
    x = T.randn((2, 64), g)
    w8, s8 = T.fp8_weight(8, 64, "tensor", g)
    with pytest.raises(ValueError, match="^act:"):
        fp8_gemv(x, w8, s8, act="gelu")
    with pytest.raises(ValueError, match="^norm:"):
        fp8_gemv(x, w8, s8, norm=torch.ones(64))
    with pytest.raises(ValueError, match="^residual:"):
        fp8_gemv(x, w8, s8, residual=T.randn((2, 9), g))
    with pytest.raises(ValueError, match="^residual:"):
        fp8_gemv(x, w8, s8, residual=T.randn((2, 4), g), act="swiglu")
    with pytest.raises(ValueError, match="^act:"):
        fp8_gemv(x, T.fp8_weight(7, 64, "tensor", g)[0], s8, act="swiglu")
    with pytest.raises(ValueError, match="^x_rows:"):
        fp8_gemv(x, w8, s8, x_rows=torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="^norm_segments:"):
        fp8_gemv(x, w8, s8, norm=T.randn((64,), g), norm_segments=3)

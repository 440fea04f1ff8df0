"""The MoE's L2 prefetch from the top-k kernel (plugins/_prefetch.py, moe_route.PREFETCH_*):
the chunking and the requests' address maths in the interpreter, the same ids and outputs with
the prefetch on, and the instruction's place in the sm_90 PTX (compiled here, no GPU)."""

import importlib
import subprocess
import sys

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins._common import HAVE_TRITON, launch, tl
from kolibri_trt_plugins._prefetch import MAX_BYTES, chunk_span, chunking
from kolibri_trt_plugins.moe import moe_forward
from kolibri_trt_plugins.moe_route import _prefetch_item, moe_route

RT = importlib.import_module("kolibri_trt_plugins.moe_route")
E, H, I_, IS, K = 8, 64, 32, 48, 2
# Kolibri-1's bytes per expert: w13 2·768·2560, w2 2560·768 (e4m3); odd sizes beside them
SIZES = [0, 15, 16, 17, MAX_BYTES, MAX_BYTES + 1, 2 * MAX_BYTES + 33, 1_966_080, 3_932_160]

if HAVE_TRITON:
    import triton

    @triton.jit
    def _spans_kernel(out_ptr, base, nbytes, per):
        c = tl.program_id(0)
        a, s = chunk_span(base, nbytes, c, per)
        tl.store(out_ptr + 2 * c, a)
        tl.store(out_ptr + 2 * c + 1, s)

    @triton.jit
    def _items_kernel(out_ptr, ids_ptr, a13, a2, as13, as2, b13, b2, bs13, bs2, p13, p2, ps13,
                      ps2, C13: tl.constexpr, C2: tl.constexpr, CS13: tl.constexpr,
                      CS2: tl.constexpr, TOPK: tl.constexpr, K_P: tl.constexpr):
        m = tl.program_id(0).to(tl.int64)
        q = tl.program_id(1)
        kk = tl.arange(0, K_P)
        sel = tl.load(ids_ptr + m * TOPK + kk, mask=kk < TOPK, other=0)
        base, nbytes, c, per = _prefetch_item(q, m, sel, kk, a13, a2, as13, as2, b13, b2, bs13,
                                              bs2, p13, p2, ps13, ps2, C13, C2, CS13, CS2, TOPK)
        a, s = chunk_span(base, nbytes, c, per)
        row = (m * tl.num_programs(1) + q) * 2
        tl.store(out_ptr + row, a)
        tl.store(out_ptr + row + 1, s)


@pytest.mark.parametrize("nbytes", SIZES)
def test_chunking_covers_the_region(nbytes):
    n, per = chunking(nbytes)
    assert per % 16 == 0 and per <= MAX_BYTES
    assert n * per >= nbytes and (n - 1) * per < max(nbytes, 1)


def test_chunking_rejects_a_negative_size():
    with pytest.raises(ValueError, match="nbytes"):
        chunking(-1)


def _union(spans):
    """Merged [lo, hi) intervals of (address, bytes) pairs with bytes > 0."""
    out = []
    for a, s in sorted((a, s) for a, s in spans if s > 0):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], a + s)
        else:
            out.append([a, a + s])
    return [tuple(x) for x in out]


@pytest.mark.parametrize("base", [1 << 40, (1 << 40) + 5])
@pytest.mark.parametrize("nbytes", SIZES[1:])
def test_chunk_spans_tile_the_region(interp, base, nbytes):
    """Each chunk's span is 16-aligned, at most MAX_BYTES, and the spans tile the region from
    its first to its last 16-byte boundary without overlap."""
    n, per = chunking(nbytes)
    out = torch.zeros(2 * n, dtype=torch.int64)
    launch(_spans_kernel, (n,), out, base, nbytes, per, interpret=True)
    spans = out.view(n, 2).tolist()
    assert all(a % 16 == 0 and s % 16 == 0 and s <= MAX_BYTES for a, s in spans)
    assert sum(s for _, s in spans if s > 0) == (base + nbytes) // 16 * 16 - base // 16 * 16
    want = [(base // 16 * 16, (base + nbytes) // 16 * 16)] if nbytes >= 16 - base % 16 else []
    assert _union(spans) == [w for w in want if w[1] > w[0]]


@pytest.mark.parametrize("mode", [1, 2, 3])
@pytest.mark.parametrize("shared", [True, False])
def test_requests_ask_for_the_chosen_experts(interp, mode, shared):
    """Every token's requests cover exactly its experts' w13 (modes 1, 2) and w2 (2, 3)
    regions, token 0's the shared expert's too; an expert picked twice is asked for once per
    pick."""
    topk, b13, b2, bs13, bs2 = 3, 3 * MAX_BYTES + 48, 2 * MAX_BYTES - 16, MAX_BYTES + 32, 4096
    a13, a2, as13, as2 = 1 << 40, 1 << 41, 1 << 42, 1 << 43
    ids = torch.tensor([[5, 0, 7], [7, 2, 5]], dtype=torch.int32)
    up, down = mode in (1, 2), mode in (2, 3)
    c13, p13 = chunking(b13 if up else 0)
    c2, p2 = chunking(b2 if down else 0)
    cs13, ps13 = chunking(bs13 if shared and up else 0)
    cs2, ps2 = chunking(bs2 if shared and down else 0)
    req = topk * (c13 + c2) + cs13 + cs2
    out = torch.zeros((2, req, 2), dtype=torch.int64)
    launch(_items_kernel, (2, req), out, ids, a13, a2, as13, as2, b13, b2, bs13, bs2, p13, p2,
           ps13, ps2, C13=c13, C2=c2, CS13=cs13, CS2=cs2, TOPK=topk, K_P=4, interpret=True)
    for m in range(2):
        picked = sorted(ids[m].tolist())
        want = [(a13 + e * b13, a13 + (e + 1) * b13) for e in picked] if up else []
        want += [(a2 + e * b2, a2 + (e + 1) * b2) for e in picked] if down else []
        if shared and m == 0:
            want += ([(as13, as13 + bs13)] if up else []) + ([(as2, as2 + bs2)] if down else [])
        got = out[m].tolist()
        assert _union(got) == _union([(lo, hi - lo) for lo, hi in want])
        assert sum(s for _, s in got if s > 0) == sum(hi - lo for lo, hi in want)


@pytest.mark.parametrize("mode", [1, 2, 3])
@pytest.mark.parametrize("M", [1, 3])
def test_prefetch_keeps_ids_and_outputs(interp, monkeypatch, mode, M):
    """moe_forward with the prefetch (its top-k kernel over one program per request, program 0
    storing) gives the bits of the prefetch off; moe_route alone is unchanged by it."""
    g = T.gen(70 + M)
    rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2 = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((M, H), g)
    args = (x, rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2)
    off = moe_forward(*args, top_k=K, interpret=True)
    ids_off = moe_route(x, rw, K, interpret=True)
    monkeypatch.setattr(RT, "PREFETCH_TOKENS", 4)
    monkeypatch.setattr(RT, "PREFETCH", mode)
    assert RT._prefetch_args(M, K, (w13, w2, sw13, sw2), True)[0] > 1
    assert torch.equal(moe_forward(*args, top_k=K, interpret=True), off)
    ids_on = moe_route(x, rw, K, interpret=True)
    assert all(torch.equal(a, b) for a, b in zip(ids_on, ids_off))


def test_unknown_prefetch_mode_raises(interp, monkeypatch):
    g = T.gen(79)
    rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2 = T.moe_weights(E, H, I_, IS, g)
    monkeypatch.setattr(RT, "PREFETCH", 4)
    with pytest.raises(ValueError, match="PREFETCH"):
        moe_forward(T.randn((1, H), g), rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2, top_k=K,
                    interpret=True)


COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import importlib
RT = importlib.import_module("kolibri_trt_plugins.moe_route")

pf = sys.argv[1] == "1"
ints = ("M", "E", "a13", "a2", "as13", "as2", "b13", "b2", "bs13", "bs2", "p13", "p2", "ps13",
        "ps2")
sig = dict(lg_ptr="*fp32", ids_ptr="*i32", w_ptr="*fp32", **{n: "i64" for n in ints})
consts = dict(TOPK=6, E_P=256, K_P=8, RENORM=True, SPLIT=5, PF=pf, C13=4, C2=2, CS13=4, CS2=2,
              ASM=True, PDL=3)
sig.update({n: "constexpr" for n in consts})
ck = triton.compile(ASTSource(RT._topk_kernel, sig, constexprs=consts),
                    target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))
print(ck.asm["ptx"])
"""


@pytest.mark.parametrize("pf", [True, False])
def test_prefetch_in_the_sm90_ptx(interp, pf):
    """Compiled for sm_90 under PDL mode 3 (the MoE's early launch): one bulk prefetch, after
    griddepcontrol.wait and before the stores, only with PF. In a fresh process: the
    interpreter, which other tests run, patches the builtins the compiler uses."""
    done = subprocess.run([sys.executable, "-c", COMPILE, "1" if pf else "0"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    pre = [i for i, ln in enumerate(lines) if "cp.async.bulk.prefetch.L2.global" in ln]
    assert len(pre) == (1 if pf else 0)
    wait = [i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln]
    stores = [i for i, ln in enumerate(lines) if "st.global" in ln]
    assert len(wait) == 1 and stores and wait[0] < min(stores)
    if pf:
        assert wait[0] < pre[0] < min(stores)

"""The MoE's L2 prefetch from the top-k kernel (plugins/_prefetch.py, moe_route.PREFETCH_*):
the chunking, the requests the kernel itself makes (logged in the interpreter) against the
chosen experts' weight regions, the same ids and outputs with the prefetch on, and the
instruction's place in the sm_90 PTX (compiled here, no GPU)."""

import importlib
import subprocess
import sys

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins._common import HAVE_TRITON, launch, tl
from kolibri_trt_plugins._prefetch import MAX_BYTES, chunk_span, chunking
from kolibri_trt_plugins.moe import moe_forward
from kolibri_trt_plugins.moe_route import launch_moe_route, moe_route_ref

RT = importlib.import_module("kolibri_trt_plugins.moe_route")
PF = importlib.import_module("kolibri_trt_plugins._prefetch")
E, H, I_, IS, K = 8, 64, 32, 48, 2
# Kolibri-1's bytes per expert: w13 2·768·2560, w2 2560·768 (e4m3); odd sizes beside them
SIZES = [0, 15, 16, 17, MAX_BYTES, MAX_BYTES + 1, 2 * MAX_BYTES + 33, 1_966_080, 3_932_160]
MODES = {1: (True, False), 2: (True, True), 3: (False, True)}   # (gate/up, down) asked for

if HAVE_TRITON:
    import triton

    @triton.jit
    def _spans_kernel(out_ptr, base, nbytes, per):
        c = tl.program_id(0)
        a, s = chunk_span(base, nbytes, c, per)
        tl.store(out_ptr + 2 * c, a)
        tl.store(out_ptr + 2 * c + 1, s)


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


def _region(w, e):
    """[lo, hi) bytes of expert e of an e4m3 weight [E, R, C], inner 16-byte boundaries (what
    chunk_span asks for)."""
    size = w[0].numel()
    lo = w.data_ptr() + e * size
    return (lo // 16 * 16, (lo + size) // 16 * 16)


@pytest.mark.parametrize("mode", [1, 2, 3])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("max_bytes", [MAX_BYTES, 1008])
def test_kernel_requests_cover_the_chosen_experts(interp, monkeypatch, mode, shared, max_bytes):
    """The top-k kernel's own requests (its log, interpreter), 3 tokens: each token's cover
    exactly its experts' w13 (modes 1, 2) and w2 (2, 3) regions, token 0's the shared expert's
    too (an expert two tokens picked is asked for by both); 1008-byte requests split each
    expert into several. The ids are the reference's."""
    monkeypatch.setattr(RT, "PREFETCH_TOKENS", 4)
    monkeypatch.setattr(RT, "PREFETCH", mode)
    monkeypatch.setattr(PF, "MAX_BYTES", max_bytes)
    g = T.gen(60 + mode)
    rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2 = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((3, H), g)
    log = []
    ids, _ = launch_moe_route(x, rw, K, True, True, (w13, w2, sw13 if shared else None,
                                                     sw2 if shared else None), log)
    assert torch.equal(ids, moe_route_ref(x, rw, K)[0])
    up, down = MODES[mode]
    assert len(log) == 1 and log[0].shape[:2] == (3, RT._prefetch_args(
        3, K, (w13, w2, sw13 if shared else None, sw2 if shared else None), True, x.device)[0])
    for m in range(3):
        want = [_region(w13, e) for e in ids[m].tolist()] if up else []
        want += [_region(w2, e) for e in ids[m].tolist()] if down else []
        if shared and m == 0:
            want += ([_region(sw13, 0)] if up else []) + ([_region(sw2, 0)] if down else [])
        got = log[0][m].tolist()
        assert all(s <= max_bytes and a % 16 == 0 for a, s in got if s > 0)
        assert _union(got) == _union([(lo, hi - lo) for lo, hi in want])
        assert sum(s for _, s in got if s > 0) == sum(hi - lo for lo, hi in want)


def test_no_requests_past_the_token_limit(interp, monkeypatch):
    """Chunks of more than PREFETCH_TOKENS tokens run one top-k program per token and log
    nothing."""
    monkeypatch.setattr(RT, "PREFETCH_TOKENS", 2)
    g = T.gen(66)
    rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2 = T.moe_weights(E, H, I_, IS, g)
    log = []
    launch_moe_route(T.randn((3, H), g), rw, K, True, True, (w13, w2, sw13, sw2), log)
    assert log == []


@pytest.mark.parametrize("mode", [1, 2, 3])
@pytest.mark.parametrize("M", [1, 3])
def test_prefetch_keeps_the_moe_bits(interp, monkeypatch, mode, M):
    """moe_forward with the prefetch (its top-k kernel over one program per request, program 0
    storing) gives the bits of the prefetch off."""
    g = T.gen(70 + M)
    rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2 = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((M, H), g)
    args = (x, rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2)
    off = moe_forward(*args, top_k=K, interpret=True)
    monkeypatch.setattr(RT, "PREFETCH_TOKENS", 4)
    monkeypatch.setattr(RT, "PREFETCH", mode)
    assert torch.equal(moe_forward(*args, top_k=K, interpret=True), off)


def test_unknown_prefetch_mode_raises(interp, monkeypatch):
    g = T.gen(79)
    rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2 = T.moe_weights(E, H, I_, IS, g)
    monkeypatch.setattr(RT, "PREFETCH", 4)
    with pytest.raises(ValueError, match="PREFETCH"):
        moe_forward(T.randn((1, H), g), rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2, top_k=K,
                    interpret=True)


COMPILE = """
import importlib
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
RT = importlib.import_module("kolibri_trt_plugins.moe_route")

c13, c2, cs13, cs2 = (int(v) for v in sys.argv[1:5])
pf = c13 + c2 > 0
sig = dict(lg_ptr="*fp32", ids_ptr="*i32", w_ptr="*fp32", log_ptr="*i32", M="i32", E="i32")
# as the launch types them: addresses i64 (0, for weights not asked for, i32), bytes i32
for n, c in (("13", c13), ("2", c2), ("s13", cs13), ("s2", cs2)):
    sig.update({"a" + n: "i64" if c else "i32", "b" + n: "i32", "p" + n: "i32"})
consts = dict(TOPK=6, E_P=256, K_P=8, RENORM=True, SPLIT=5, PF=pf, C13=c13, C2=c2, CS13=cs13,
              CS2=cs2, ASM=True, LOG=False, PDL=3)
sig.update({n: "constexpr" for n in consts})
ck = triton.compile(ASTSource(RT._topk_kernel, sig, constexprs=consts),
                    target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))
print(ck.asm["ptx"])
"""


# (C13, C2, CS13, CS2) at Kolibri-1's sizes: off; modes 1, 2, 3 with the shared expert; 2 without
@pytest.mark.parametrize("chunks", [(0, 0, 0, 0), (4, 0, 4, 0), (4, 2, 4, 2), (0, 2, 0, 2),
                                    (4, 2, 0, 0)])
def test_prefetch_in_the_sm90_ptx(interp, chunks):
    """Compiled for sm_90 under PDL mode 3 (the MoE's early launch), with the argument types
    of a launch: one bulk prefetch, after griddepcontrol.wait and before the stores, only with
    requests. In a fresh process: the interpreter, which other tests run, patches the builtins
    the compiler uses."""
    done = subprocess.run([sys.executable, "-c", COMPILE, *map(str, chunks)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    pre = [i for i, ln in enumerate(lines) if "cp.async.bulk.prefetch.L2.global" in ln]
    assert len(pre) == (1 if any(chunks) else 0)
    wait = [i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln]
    stores = [i for i, ln in enumerate(lines) if "st.global" in ln]
    assert len(wait) == 1 and stores and wait[0] < min(stores)
    if pre:
        assert wait[0] < pre[0] < min(stores)


MOE = importlib.import_module("kolibri_trt_plugins.moe")


@pytest.mark.parametrize("max_bytes", [MAX_BYTES, 1008])
@pytest.mark.parametrize("M", [1, 3])
def test_combine_asks_for_the_next_weight(interp, monkeypatch, max_bytes, M):
    """With prefetch_next and M <= PREFETCH_NEXT_TOKENS the combine kernel's requests (its log,
    interpreter; 4 column programs, 1008-byte requests: more chunks than programs) tile the
    tensor's bytes, each asked for once (not once per token or program), the output's bits
    unchanged; past the limit nothing is asked."""
    g = T.gen(80 + M)
    wts = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((M, H), g)
    nxt = T.randn((200, H), g).to(torch.float8_e4m3fn)   # 12,800 bytes
    off = moe_forward(x, *wts, top_k=K, interpret=True)
    monkeypatch.setattr(PF, "MAX_BYTES", max_bytes)
    monkeypatch.setattr(MOE, "PREFETCH_NEXT_TOKENS", 3)
    monkeypatch.setattr(MOE, "BLOCK_H", 16)
    log = []
    got = MOE._launch(x, *wts, K, True, True, nxt, log)
    assert torch.equal(got, off)
    assert torch.equal(moe_forward(x, *wts, top_k=K, interpret=True, prefetch_next=nxt), off)
    assert len(log) == 1
    rows = log[0].tolist()
    assert len(rows) == chunking(nxt.numel())[0] and all(n == 1 for _, _, n in rows)
    assert all(0 < s <= max_bytes and a % 16 == 0 for a, s, _ in rows)
    assert _union([(a, s) for a, s, _ in rows]) == [_region(nxt[None], 0)]
    monkeypatch.setattr(MOE, "PREFETCH_NEXT_TOKENS", M - 1)
    log = []
    MOE._launch(x, *wts, K, True, True, nxt, log)
    assert log == []


def test_the_op_hands_prefetch_next_to_the_kernels(monkeypatch):
    """moe_forward's op (the GPU path, its kernels replaced by a spy) receives prefetch_next."""
    g = T.gen(84)
    wts = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((1, H), g)
    nxt = torch.zeros((8, H), dtype=torch.float8_e4m3fn)
    seen = []
    monkeypatch.setattr(MOE, "kernel_path", lambda t, what: "triton")
    monkeypatch.setattr(MOE, "_launch", lambda *a: seen.append(a) or torch.empty_like(a[0]))
    moe_forward(x, *wts, top_k=K, prefetch_next=nxt)
    moe_forward(x, *wts, top_k=K)
    assert [a[-1] is nxt for a in seen] == [True, False] and seen[1][-1] is None


def test_prefetch_next_is_checked(interp, monkeypatch):
    """A non-contiguous prefetch_next, or one on another device than x, raises naming it."""
    g = T.gen(85)
    wts = T.moe_weights(E, H, I_, IS, g)
    with pytest.raises(ValueError, match="prefetch_next"):
        moe_forward(T.randn((1, H), g), *wts, top_k=K, interpret=True,
                    prefetch_next=torch.zeros((4, 4))[:, ::2])
    monkeypatch.setattr(MOE, "PREFETCH_NEXT_TOKENS", 4)
    with pytest.raises(ValueError, match="prefetch_next: on meta"):
        MOE._next_args(torch.zeros((1, H)), torch.zeros(4, device="meta"), True, None)


COMPILE_COMBINE = """
import importlib
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
MOE = importlib.import_module("kolibri_trt_plugins.moe")

chunks = int(sys.argv[1])
sig = dict(o_ptr="*fp32", w_ptr="*fp32", y_ptr="*bf16", log_ptr="*bf16", H="i32", so_m="i32",
           so_s="i32", pf_addr="i64" if chunks else "i32", pf_bytes="i32", pf_per="i32")
consts = dict(TOPK=6, HAS_SHARED=True, BLOCK_H=256, PF_CHUNKS=chunks, ASM=True, LOG=False,
              PDL=3)
sig.update({n: "constexpr" for n in consts})
ck = triton.compile(ASTSource(MOE._moe_combine_kernel, sig, constexprs=consts),
                    target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
print(ck.asm["ptx"])
"""


@pytest.mark.parametrize("chunks", [0, 10])
def test_combine_prefetch_in_the_sm90_ptx(interp, chunks):
    """The combine kernel for sm_90 under PDL mode 3: with chunks, one bulk prefetch (in the
    loop over the program's chunks) before griddepcontrol.wait (the bytes are static); none
    without. In a fresh process, as above."""
    done = subprocess.run([sys.executable, "-c", COMPILE_COMBINE, str(chunks)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    pre = [i for i, ln in enumerate(lines) if "cp.async.bulk.prefetch.L2.global" in ln]
    wait = [i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln]
    assert len(pre) == (1 if chunks else 0) and len(wait) == 1
    if pre:
        assert pre[0] < wait[0]

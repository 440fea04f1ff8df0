#!/usr/bin/env python3
"""Compile a plugin kernel for sm_90 here (no GPU) and count what its SASS does per loop.

    python3 bench/aot_sass.py nvfp4_head [--stages 3] [--warps 4] [--set BLOCK_N=32] [--dump DIR]

Triton builds the kernel ahead of time for GPUTarget("cuda", 90, 32) with its bundled ptxas;
the pointers and the integer arguments named in the preset carry tt.divisibility 16, as the JIT
marks them on the H200. Printed: registers, spilled bytes, shared memory, whether the TTGIR holds
cp.async copies (``async_copy_global_to_local``) and how many buffers its ``local_alloc``s have,
then per loop (a backward branch) its SASS instruction count and the most frequent opcodes. A
static look: it tells issue-bound from latency-bound before device time is spent (plugins/
NOTES.md, "Pipelined loads").
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import pathlib
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = pathlib.Path(__file__).resolve().parents[1]
CUOBJDUMP = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"

# name: (module, kernel, {arg: type string or constexpr value}, args with divisibility 16)
PRESETS = {
    "nvfp4_head": ("nvfp4_gemv", "_nvfp4_gemv_kernel", dict(
        x_ptr="*bf16", w_ptr="*u8", ws_ptr="*fp8e4nv", gs_ptr="*fp32", y_ptr="*bf16",
        g_ptr="*bf16", M="i32", N="i32", K="i32", sx_m="i32", sw_n="i32", ss_n="i32", eps="fp32",
        BLOCK_N=64,
        BLOCK_K=256, ROWS=16, MT=1, USE_ASM=True, DOT_F32=False, NORM=False, DECODE=3),
        ("x_ptr", "w_ptr", "ws_ptr", "gs_ptr", "y_ptr", "g_ptr", "N", "K", "sx_m", "sw_n",
         "ss_n")),
    "moe_gate_up": ("moe_experts", "_moe_expert_kernel", dict(
        a_ptr="*bf16", ids_ptr="*i32", w_ptr="*fp8e4nv", ws_ptr="*fp32", shw_ptr="*fp8e4nv",
        shs_ptr="*fp32", o_ptr="*bf16", y_ptr="*bf16", cnt_ptr="*i32", M="i32", N="i32",
        K="i32", N_SH="i32", K_SH="i32", sa_m="i32", sa_s="i32", so_s="i32", sp_s="i32",
        sp_g="i32", sy_s="i32", TOPK=6, GATED=True,
        BLOCK_N=32, BLOCK_K=128, ROWS=16, MT=1, M_P=16, K_P=8, U_P=16, DOT_F32=False, SPLIT=1,
        DECODE=3, ONE=False, SHARED=True, SH=1, SH_TOKENS=64, BY_EXPERT=False,
        ALIGNED=False),
        ("a_ptr", "ids_ptr", "w_ptr", "ws_ptr", "shw_ptr", "shs_ptr", "o_ptr", "N", "K", "N_SH",
         "K_SH", "sa_m", "sa_s", "so_s")),
    "fp8_qkv": ("fp8_gemv", "_fp8_gemv_kernel", dict(
        x_ptr="*bf16", w_ptr="*fp8e4nv", s_ptr="*fp32", y_ptr="*bf16", g_ptr="*bf16",
        r_ptr="*bf16", ids_ptr="*i64", M="i32", N="i32", K="i32", sx_m="i32", sr_m="i32",
        s_ids="i32", eps="fp32", MODE=0, BLOCK_N=32, BLOCK_K=256, SUB_K=64, ROWS=16, MT=1,
        DOT_F32=False, SPLIT=1, NORM=0, NORM_P=1, ACT=0, RES=False, X_ROWS=False, DECODE=3),
        ("x_ptr", "w_ptr", "s_ptr", "y_ptr", "g_ptr", "r_ptr", "ids_ptr", "N", "K", "sx_m")),
}
PRESETS["int4_attn"] = ("int4_paged_attention", "_int4_attn_kernel", dict(
    q_ptr="*bf16", kc_ptr="*u8", vc_ptr="*u8", km_ptr="*fp16", vm_ptr="*fp16", bt_ptr="*i32",
    seq_ptr="*i32", cuq_ptr="*i32", m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32",
    qk_scale="fp32", HQ="i32", HKV="i32", G="i32", S="i32", RT="i32", bt_stride="i32",
    window="i32", BLOCK=64, PART=512, BLOCK_M=8, BLOCK_N=32, D=128, USE_ASM=True,
    DOT_F32=False, MASK_FREE=True, DEFER_SUMS=True),
    ("q_ptr", "kc_ptr", "vc_ptr", "km_ptr", "vm_ptr", "bt_ptr", "seq_ptr", "cuq_ptr", "m_ptr",
     "l_ptr", "acc_ptr", "bt_stride"))
PRESETS["fp8_attn"] = ("fp8_paged_attention", "_fp8_attn_kernel", dict(
    PRESETS["int4_attn"][2], k_ptr="*fp8e4nv", v_ptr="*fp8e4nv", ks_ptr="*fp32", vs_ptr="*fp32",
    BLOCK_M=16), ("q_ptr", "k_ptr", "v_ptr", "ks_ptr", "vs_ptr", "bt_ptr", "seq_ptr", "cuq_ptr",
                  "m_ptr", "l_ptr", "acc_ptr", "bt_stride"))
for _k in ("kc_ptr", "vc_ptr", "km_ptr", "vm_ptr", "USE_ASM", "MASK_FREE", "DEFER_SUMS"):
    del PRESETS["fp8_attn"][2][_k]
PRESETS["moe_down"] = ("moe_experts", "_moe_expert_kernel",
                       dict(PRESETS["moe_gate_up"][2], o_ptr="*fp32", y_ptr="*fp32",
                            GATED=False, BLOCK_N=64),
                       PRESETS["moe_gate_up"][3])
PRESETS["fp8_drafter_block"] = ("fp8_gemv", "_fp8_gemv_kernel",
                                dict(PRESETS["fp8_qkv"][2], MODE=2, BLOCK_N=16),
                                PRESETS["fp8_qkv"][3])

# the MoE's top-k kernel under PDL mode 3 (its early launch); --set PF=1: the L2 prefetch
# requests of one token (6 experts x (4 + 2) chunks + the shared expert's 6)
PRESETS["moe_topk"] = ("moe_route", "_topk_kernel", dict(
    lg_ptr="*fp32", ids_ptr="*i32", w_ptr="*fp32", log_ptr="*i32", M="i32", E="i32",
    **{n: "i64" for n in ("a13", "a2", "as13", "as2")},     # as a launch types them
    **{n: "i32" for n in ("b13", "b2", "bs13", "bs2", "p13", "p2", "ps13", "ps2")},
    TOPK=6, E_P=256, K_P=8, RENORM=True, SPLIT=5, PF=False, C13=4, C2=2, CS13=4, CS2=2,
    ASM=True, PDL=3), ("lg_ptr", "ids_ptr", "w_ptr"))
PRESETS["splitk_norm"] = ("gemv_add_rms_norm", "_splitk_add_rms_norm_kernel", dict(
    p_ptr="*fp32", s_ptr="*fp32", r_ptr="*bf16", g_ptr="*bf16", h_ptr="*bf16", y_ptr="*bf16",
    M="i32", sr_m="i32", eps="fp32", N=2560, MODE=0, SPLIT=3, BLOCK=4096),
    ("p_ptr", "s_ptr", "r_ptr", "g_ptr", "h_ptr", "y_ptr", "sr_m"))


def compile_sm90(module: str, kernel: str, args: dict, divisible, num_warps: int,
                 num_stages: int):
    """triton.compile of plugins/<module>.<kernel> for sm_90; returns the CompiledKernel."""
    sys.path.insert(0, str(ROOT))
    mod = importlib.import_module(f"plugins.{module}")
    fn = getattr(mod, kernel)
    names = list(fn.arg_names)
    unknown = set(args) - set(names)
    if unknown:
        raise ValueError(f"{kernel}: no arguments named {sorted(unknown)}")
    # parameters left out take their defaults (e.g. fp8_gemv's KB = 1, PDL = 0)
    args = {**{p.name: p.default for p in fn.params
               if p.name not in args and p.default is not inspect.Parameter.empty}, **args}
    sig = {n: ("constexpr" if not isinstance(args[n], str) else args[n])
           for n in names if n in args}
    consts = {n: v for n, v in args.items() if not isinstance(v, str)}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def cuobjdump(ck, flag: str) -> str:
    """``cuobjdump <flag>`` of the kernel's cubin (-sass: the listing; -res-usage: REG, STACK)."""
    with tempfile.TemporaryDirectory() as d:
        cubin = pathlib.Path(d) / "k.cubin"
        cubin.write_bytes(ck.asm["cubin"])
        return subprocess.run([str(CUOBJDUMP), flag, str(cubin)], check=True,
                              capture_output=True, text=True).stdout


def loops(sass: str):
    """(start index, end index, opcode counter) per backward branch of the SASS listing."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(4)))
    out = []
    for i, (addr, op, rest) in enumerate(ins):
        t = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if t and int(t.group(1), 16) < addr:
            j = next(k for k, x in enumerate(ins) if x[0] >= int(t.group(1), 16))
            out.append((j, i, collections.Counter(x[1].split(".")[0] for x in ins[j:i + 1])))
    return out, len(ins)


def report(ck, sass: str) -> None:
    md = ck.metadata
    ttgir = ck.asm["ttgir"]
    res = re.search(r"REG:(\d+) STACK:(\d+)", cuobjdump(ck, "-res-usage"))
    print(f"registers {res.group(1)}, stack {res.group(2)} B, shared {md.shared} B, "
          f"warps {md.num_warps}, stages {md.num_stages}")
    allocs = re.findall(r"ttg\.local_alloc.*?!ttg\.memdesc<(\d+)x", ttgir)
    print(f"cp.async copies in TTGIR: {ttgir.count('async_copy_global_to_local')}, "
          f"local_alloc leading dims: {allocs}")
    found, total = loops(sass)
    print(f"SASS instructions: {total}")
    for j, i, c in found:
        top = ", ".join(f"{k} {v}" for k, v in c.most_common(12))
        print(f"  loop [{j}..{i}] {i - j + 1} instructions: {top}")
        sync = sum(v for k, v in c.items() if k.startswith("LDG") and not k.startswith("LDGSTS")
                   and k != "LDGDEPBAR")
        print(f"    synchronous global loads (LDG) in the loop: {sync}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=INT",
                    help="override a constexpr")
    ap.add_argument("--dump", type=pathlib.Path, help="write ttgir, ptx and sass here")
    a = ap.parse_args()
    module, kernel, args, div = PRESETS[a.preset]
    args = dict(args)
    for s in a.set:
        name, _, val = s.partition("=")
        if isinstance(args.get(name), str):
            raise SystemExit(f"--set {s}: {name} is not a constexpr of {kernel}")
        args[name] = type(args.get(name, 0))(int(val))   # compile_sm90 rejects unknown names
    ck = compile_sm90(module, kernel, args, div, a.warps, a.stages)
    sass = cuobjdump(ck, "-sass")
    report(ck, sass)
    if a.dump:
        a.dump.mkdir(parents=True, exist_ok=True)
        for ext, text in (("ttgir", ck.asm["ttgir"]), ("ptx", ck.asm["ptx"]), ("sass", sass)):
            (a.dump / f"{a.preset}.{ext}").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

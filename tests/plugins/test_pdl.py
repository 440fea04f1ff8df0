"""Programmatic dependent launch (plugins/_common.py PDL): every launched kernel takes part (a
PDL parameter, `pdl_enter(PDL)` before any memory access: first, or after a block that only
asks L2 for static bytes (plugins/_prefetch.py), a `pdl_release(PDL)`), and the switch is
checked."""

import ast
import importlib
import inspect
import os
import subprocess
import sys

import pytest

from kolibri_trt_plugins import _common

MODULES = ("add_rms_norm", "attn_combine", "chain_index", "fp8_gemv", "fp8_kv_write",
           "gumbel_argmax", "moe", "moe_experts", "moe_route", "moe_split_combine",
           "nvfp4_gemv", "qk_norm_fold_int4", "qk_norm_rope", "qk_norm_rope_kv_write",
           "ring_attention", "rope_ring_write", "vocab_argmax", "int4_paged_attention",
           "fp8_paged_attention")


def _launched_kernels():
    """(module, name, JITFunction) of every `_..._kernel` the modules define (the debug
    `_noise_kernel` of gumbel_argmax aside: tests only, never in a step)."""
    from triton.runtime.jit import JITFunction
    for m in MODULES:
        mod = importlib.import_module(f"kolibri_trt_plugins.{m}")
        for name, obj in vars(mod).items():
            if isinstance(obj, JITFunction) and name.endswith("_kernel") and name != "_noise_kernel":
                yield m, name, obj


def test_every_launched_kernel_enters_with_pdl():
    found = list(_launched_kernels())
    assert len(found) >= 20
    for m, name, k in found:
        assert "PDL" in k.arg_names, (m, name)
        body = ast.parse(inspect.getsource(k.fn).lstrip()).body[0].body
        stmts = [s for s in body if not (isinstance(s, ast.Expr)
                                         and isinstance(s.value, ast.Constant))]
        if _prefetch_only(stmts[0]):
            stmts = stmts[1:]
        assert ast.unparse(stmts[0]) == "pdl_enter(PDL)", (m, name, ast.unparse(stmts[0]))
        assert _releases(importlib.import_module(f"kolibri_trt_plugins.{m}"), k), (m, name)


def _prefetch_only(stmt) -> bool:
    """An `if` block that only asks L2 for chunks (`_prefetch.ask_chunks`, whose log form
    alone stores: kernels call that after the wait) and reads program ids: no load, store or
    atomic, nothing that reads what the kernel before writes."""
    if not isinstance(stmt, ast.If):
        return False
    calls = {ast.unparse(n.func) for n in ast.walk(stmt) if isinstance(n, ast.Call)}
    allowed = {"ask_chunks", "tl.program_id", "tl.num_programs"}
    asks = [n for n in ast.walk(stmt) if isinstance(n, ast.Call)
            and ast.unparse(n.func) == "ask_chunks"]
    logless = all(ast.unparse(n.args[-1]) == "False" for n in asks)   # LOG off
    return bool(asks) and logless and calls <= allowed


def _releases(mod, fn) -> bool:
    """`pdl_release(PDL)` in fn's source or in a @jit helper of mod that fn passes PDL to."""
    from triton.runtime.jit import JITFunction
    src = inspect.getsource(fn.fn)
    if "pdl_release(PDL)" in src:
        return True
    for node in ast.walk(ast.parse(src.lstrip())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and any(isinstance(a, ast.Name) and a.id == "PDL" for a in node.args)):
            helper = getattr(mod, node.func.id, None)
            if isinstance(helper, JITFunction) and helper is not fn and _releases(mod, helper):
                return True
    return False


def test_switch_defaults_to_mode_4_and_is_checked():
    env = {k: v for k, v in os.environ.items() if k != "KOLIBRI_PDL"}
    code = "import kolibri_trt_plugins._common as c; print(c.PDL)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "4", out.stderr
    bad = subprocess.run([sys.executable, "-c", code], env=dict(env, KOLIBRI_PDL="yes"),
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "KOLIBRI_PDL: must be one of" in bad.stderr


def test_off_means_no_pdl_launch(monkeypatch):
    """With PDL off, `launch` never asks the device and never adds launch_pdl."""
    monkeypatch.setattr(_common, "PDL", 0)
    assert not _common._pdl_here()


@pytest.mark.parametrize("mode,early,want", [(2, True, 2), (2, False, 2), (3, False, 3),
                                             (4, True, 3), (4, False, 2), (0, True, 0)])
def test_kernel_mode(monkeypatch, mode, early, want):
    """Mode 4: the kernels launched with pdl_early (the MoE's, up to PDL_EARLY_TOKENS tokens)
    let the next kernel launch once they have waited (3), the others after their main loop
    (2)."""
    monkeypatch.setattr(_common, "PDL", mode)
    assert _common.kernel_pdl(early) == want


GROUPED = {"moe": ("moe", "moe_route", "moe_experts", "moe_split_combine"),
           "gemv": ("fp8_gemv", "nvfp4_gemv"), "attn": ("_paged", "attn_combine"),
           "norm": ("add_rms_norm", "fp8_kv_write", "qk_norm_fold_int4", "qk_norm_rope",
                    "qk_norm_rope_kv_write")}


@pytest.mark.parametrize("group", sorted(GROUPED))
def test_grouped_kernels_pass_pdl_early(group):
    """Every launch in a group's modules passes pdl_early (mode 4 acts on the groups listed in
    KOLIBRI_PDL_EARLY alone)."""
    for m in GROUPED[group]:
        src = inspect.getsource(importlib.import_module(f"kolibri_trt_plugins.{m}"))
        calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name) and n.func.id == "launch"]
        assert calls, m
        for c in calls:
            assert any(k.arg == "pdl_early" for k in c.keywords), (m, ast.unparse(c)[:80])


def test_early_launch_groups(monkeypatch):
    """early_launch: the listed groups up to PDL_EARLY_TOKENS tokens; unknown groups raise; the
    switch is checked on import."""
    monkeypatch.setattr(_common, "PDL_EARLY_GROUPS", ("moe", "gemv"))
    monkeypatch.setattr(_common, "PDL_EARLY_TOKENS", 16)
    assert _common.early_launch("moe", 16) and _common.early_launch("gemv", 1)
    assert not _common.early_launch("moe", 17) and not _common.early_launch("attn", 1)
    with pytest.raises(ValueError, match="group 'sampler'"):
        _common.early_launch("sampler", 1)
    env = dict(os.environ, KOLIBRI_PDL_EARLY="moe,bogus")
    bad = subprocess.run([sys.executable, "-c", "import kolibri_trt_plugins._common"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "KOLIBRI_PDL_EARLY: comma list" in bad.stderr
    env = dict(os.environ, KOLIBRI_PDL_EARLY_TOKENS="many")
    bad = subprocess.run([sys.executable, "-c", "import kolibri_trt_plugins._common"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "KOLIBRI_PDL_EARLY_TOKENS: a token count" in bad.stderr


@pytest.mark.parametrize("module, name, weights", [
    ("_fp8_wgmma_gluon", "_wgmma_gemv", "w_ring"),
    ("_nvfp4_wgmma_gluon", "_wgmma_nvfp4", "s_ring")])
def test_gluon_kernels_wait_after_the_weights_first_copies(module, name, weights):
    """The wgmma GEMVs (Gluon) take part too: a PDL parameter, the wait after the prologue's
    weight (and scale) copies and before any x copy, the release after the main loop (their
    PTX order: tests/plugins/test_gluon_probes.py)."""
    pytest.importorskip("triton.experimental.gluon")
    k = getattr(importlib.import_module(f"kolibri_trt_plugins.{module}"), name)
    assert "PDL" in k.arg_names
    src = inspect.getsource(k.fn)
    enter, release = src.index("pdl_enter(PDL)"), src.index("pdl_release(PDL)")
    assert src.index(f"{weights}.index(i)") < enter < src.index("x_ring.index(i)") < release
    assert src.count("pdl_enter(PDL)") == 1 and src.count("pdl_release(PDL)") == 1

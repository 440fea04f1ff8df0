"""bench/fullsize.py, part 5 of 5: the PNG figures (skipped when matplotlib is missing)."""

from __future__ import annotations


import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)


from fs_common import AIMS, ATTR_CLASSES, Bench, log  # noqa: E402


# =============================================================================== figures
def figures(b: Bench) -> list[str]:
    """One PNG per figure if matplotlib imports; [] otherwise."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:       # noqa: BLE001 - absent or broken: no figures
        log("matplotlib not importable: no figures")
        return []
    r, made = b.results, []

    def save(fig, name):
        path = b.out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(str(path))

    rows = r.get("decode", {}).get("rows", [])
    if rows:
        _decode(plt, rows, save)
    if any("attribution" in x for x in rows):
        _attribution(plt, [x for x in rows if "attribution" in x], save)
    if any("eager_ms" in x for x in rows):
        _graphs_vs_eager(plt, [x for x in rows if "eager_ms" in x], save)
    if r.get("verify", {}).get("rows"):
        _verify(plt, r["verify"]["rows"], save)
    if r.get("kv", {}).get("contexts"):
        _kv(plt, r["kv"]["contexts"], save)
    if r.get("drafter", {}).get("rows"):
        _drafter(plt, r["drafter"]["rows"], save)
    return made


def _label(x) -> str:
    """streams x context (in k from 1024) of a result row."""
    return f"{x['streams']}x{x['seq_len'] // 1024 or x['seq_len']}"


def _decode(plt, rows, save) -> None:
    """decode.png: ms per decode step against streams, per context, with the floors."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for ctx in sorted({x["seq_len"] for x in rows}):
        sel = [x for x in rows if x["seq_len"] == ctx]
        line, = ax.plot([x["streams"] for x in sel], [x["graph_ms"] for x in sel], "o-",
                        label=f"step, {ctx // 1024 or ctx}{'k' if ctx >= 1024 else ''}")
        ax.plot([x["streams"] for x in sel], [x["floor_ms"] for x in sel], "--",
                color=line.get_color(), label="floor")
    ax.set(xscale="log", yscale="log", xlabel="streams", ylabel="ms per decode step",
           title="Decode step (CUDA graph) vs bandwidth floor")
    ticks = sorted({x["streams"] for x in rows})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    save(fig, "decode.png")


def _attribution(plt, rows, save) -> None:
    """attribution.png: each decode row's step by kernel class (stacked bars)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottom = [0.0] * len(rows)
    for c in list(ATTR_CLASSES) + ["rest"]:
        vals = [max(0.0, x["attribution"].get(c, {}).get("ms", 0.0)) for x in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=c)
        bottom = [u + v for u, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([_label(x) for x in rows], rotation=45, fontsize=7)
    ax.set(ylabel="ms", title="Decode step by kernel class (each alone in a graph)")
    ax.legend(fontsize=7)
    save(fig, "attribution.png")


def _graphs_vs_eager(plt, rows, save) -> None:
    """graphs_vs_eager.png: graph against eager ms of the decode rows timed both ways."""
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(len(rows))
    ax.bar([i - 0.2 for i in xs], [x["graph_ms"] for x in rows], 0.4, label="graph")
    ax.bar([i + 0.2 for i in xs], [x["eager_ms"] for x in rows], 0.4, label="eager")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([_label(x) for x in rows], rotation=45, fontsize=7)
    ax.set(ylabel="ms", yscale="log", title="CUDA graphs vs eager (decode steps)")
    ax.legend()
    save(fig, "graphs_vs_eager.png")


def _verify(plt, rows, save) -> None:
    """verify.png: a verification step's time over a 1-token step, per stream count."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in sorted({x["streams"] for x in rows}):
        sel = [x for x in rows if x["streams"] == n and "vs_1token" in x]
        ax.plot([x["q"] for x in sel], [x["vs_1token"] for x in sel], "o-",
                label=f"{n} stream(s)")
    ax.axhline(AIMS["verify4_vs_step_1"], ls=":", color="grey", label="aim at 4 tokens")
    ax.set(xlabel="tokens per stream (1 + k)", ylabel="time / 1-token step",
           title="Verification cost")
    ax.legend()
    save(fig, "verify.png")


def _kv(plt, kv, save) -> None:
    """kv.png: sessions that fit and decode tok/s at full memory, INT4 against FP8 KV."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    ctxs = sorted(kv, key=int)
    for j, fmt in enumerate(("hadamard-int4", "fp8")):
        off = -0.2 + 0.4 * j
        axes[0].bar([i + off for i in range(len(ctxs))],
                    [kv[c][fmt]["sessions"] for c in ctxs], 0.4, label=fmt)
        axes[1].bar([i + off for i in range(len(ctxs))],
                    [kv[c][fmt].get("decode", {}).get("tokens_per_s", 0) for c in ctxs],
                    0.4, label=fmt)
    for ax, t in zip(axes, ("sessions that fit", "decode tok/s at full memory")):
        ax.set_xticks(range(len(ctxs)))
        ax.set_xticklabels([f"{int(c) // 1024}k" for c in ctxs])
        ax.set_title(t)
        ax.legend(fontsize=7)
    save(fig, "kv.png")


def _drafter(plt, rows, save) -> None:
    """drafter.png: the drafter's pass against the target's decode step, per stream count."""
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(rows))
    ax.bar([i - 0.2 for i in xs], [x["pass_graph_ms"] for x in rows], 0.4,
           label="drafter pass")
    ax.bar([i + 0.2 for i in xs], [x["target_step_ms"] for x in rows], 0.4,
           label="target decode step")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{x['streams']} stream(s)" for x in rows])
    ax.set(ylabel="ms", title="Drafter pass vs target step")
    ax.legend()
    save(fig, "drafter.png")

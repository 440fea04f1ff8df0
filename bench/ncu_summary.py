#!/usr/bin/env python3
"""Summarise one Nsight Compute report's text exports (bench/gpu_session.sh `ncuprof`):

    python3 bench/ncu_summary.py PREFIX [--keep]

Reads PREFIX_raw.csv (``ncu -i REP --page raw --csv``) and PREFIX_sass.csv (``--page source
--print-source sass --csv``) and writes PREFIX_stall_reasons.txt (per launch: duration,
registers, warp cycles per issued instruction by stall reason) and PREFIX_stalls_by_opcode.txt
(the warp-state samples of the SASS grouped by opcode: share of all samples, executions, the
four largest reasons). Without --keep it then deletes the two CSVs and PREFIX.ncu-rep (MBs each).
"""

from __future__ import annotations

import collections
import csv
import pathlib
import sys

STALL = "smsp__average_warps_issue_stalled_"
PER_ISSUE = "_per_issue_active.ratio"


def num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def stall_reasons(raw: pathlib.Path) -> str:
    rows = list(csv.reader(raw.open()))
    out = []
    for i, vals in enumerate(rows[2:], 1):
        d = dict(zip(rows[0], vals))
        out.append(f"launch {i}: {d.get('Kernel Name')} duration {d.get('gpu__time_duration.sum')}"
                   f" us, registers {d.get('launch__registers_per_thread')}")
        out.append(f"warp cycles per issued instruction by stall reason ({STALL}*{PER_ISSUE}):")
        items = sorted(((num(v), k[len(STALL):-len(PER_ISSUE)]) for k, v in d.items()
                        if k.startswith(STALL) and k.endswith(PER_ISSUE)), reverse=True)
        out += [f"  {v:6.2f} {k}" for v, k in items if v >= 0.005]
    return "\n".join(out) + "\n"


def by_opcode(sass: pathlib.Path, top: int = 30) -> str:
    """Per kernel block of the source page (a "Kernel Name" row, then the header, then rows)."""
    rows = list(csv.reader(sass.open()))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] + [len(rows)]
    return "".join(_by_opcode(rows[a], rows[a + 1], rows[a + 2:b], top)
                   for a, b in zip(starts, starts[1:]))


def _by_opcode(name_row, header, rows, top) -> str:
    ix = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = collections.defaultdict(collections.Counter)
    execs = collections.Counter()
    for r in rows:
        words = r[ix["Source"]].split()
        op = (words[1] if words and words[0].startswith("@") else (words or ["?"])[0])
        op = op.split(".")[0]
        for k in reasons:
            samples[op][k] += num(r[ix[k]])
        samples[op]["all"] += num(r[ix["Warp Stall Sampling (All Samples)"]])
        execs[op] += num(r[ix["Instructions Executed"]])
    total = sum(c["all"] for c in samples.values()) or 1.0
    out = [f"{' '.join(name_row[:2])}: warp-state samples {total:.0f}",
           f"{'opcode':10s} {'samples':>8s} {'executed':>10s}  largest reasons (% of all samples)"]
    for op, c in sorted(samples.items(), key=lambda x: -x[1]["all"])[:top]:
        rs = sorted(((v, k) for k, v in c.items() if k != "all" and v > 0), reverse=True)[:4]
        out.append(f"{op:10s} {100 * c['all'] / total:7.1f}% {execs[op]:10.0f}  "
                   + " ".join(f"{k[6:]}={100 * v / total:.1f}" for v, k in rs))
    return "\n".join(out) + "\n\n"


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    prefix = sys.argv[1]
    raw, sass = pathlib.Path(prefix + "_raw.csv"), pathlib.Path(prefix + "_sass.csv")
    pathlib.Path(prefix + "_stall_reasons.txt").write_text(stall_reasons(raw))
    pathlib.Path(prefix + "_stalls_by_opcode.txt").write_text(by_opcode(sass))
    if "--keep" not in sys.argv:
        for p in (raw, sass, pathlib.Path(prefix + ".ncu-rep")):
            p.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a kernel's instructions go, from ncu's SASS source page (CSV): the dynamic instruction mix by opcode, and the
same split by how often each instruction ran. In a loop kernel the execution count tells the phases apart: an
instruction run once a warp is the start or the finish, once a block (or a pair of blocks) the attention, once an
iteration the decision. Runs on the CPU on a CSV the GPU machine wrote:

    ncu ... --section SourceCounters -o rep python3 profile_decode_step.py ...      # on the GPU machine
    ncu --import rep.ncu-rep --page source --csv --print-source sass > src.csv
    python benchmarks/sass_mix.py src.csv --warps 512                               # here

``--warps`` (the grid's warps) turns counts into instructions a warp. Prints two Markdown tables.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
from pathlib import Path


def load(path: str | Path) -> list[tuple[str, int, int]]:
    """``[(opcode, times executed, stall samples)]`` of every SASS line of an ncu source-page CSV (comment lines
    starting with '#' skipped; the opcode without its predicate and modifiers: ``@!P0 HMMA.16816.F32`` -> ``HMMA``)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(line for line in f if not line.startswith("#"))]
    header, body = rows[0], rows[1:]
    for need in ("Source", "Instructions Executed"):
        if need not in header:
            raise ValueError(f"{path}: expected ncu's source page with a {need!r} column, got {header[:6]}")
    src, ex = header.index("Source"), header.index("Instructions Executed")
    st = header.index("Warp Stall Sampling (All Samples)") if "Warp Stall Sampling (All Samples)" in header else None
    out = []
    for r in body:
        if len(r) <= max(src, ex):
            continue
        text = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip())
        if not text:
            continue
        count = int(r[ex].replace(",", "") or 0)
        stalls = int(r[st].replace(",", "") or 0) if st is not None else 0
        out.append((text.split()[0].split(".")[0], count, stalls))
    return out


def mix(lines: list[tuple[str, int, int]]) -> collections.Counter:
    """Dynamic instructions by opcode."""
    total: collections.Counter = collections.Counter()
    for op, count, _ in lines:
        total[op] += count
    return total


def by_count(lines: list[tuple[str, int, int]], top: int = 8) -> list[dict]:
    """The SASS lines grouped by their execution count (one phase of a loop kernel each, mostly), largest share of
    the dynamic total first: ``count``, static ``lines``, dynamic ``share``, the ``top`` opcodes by static lines."""
    groups: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for op, count, _ in lines:
        groups[count][op] += 1
    total = sum(count for _, count, _ in lines) or 1
    rows = [dict(count=c, lines=sum(ops.values()), share=c * sum(ops.values()) / total, ops=ops.most_common(top))
            for c, ops in groups.items() if c > 0]
    return sorted(rows, key=lambda r: -r["share"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--warps", type=int, default=0, help="the grid's warps (0: counts only)")
    ap.add_argument("--rows", type=int, default=12, help="execution-count groups to print")
    args = ap.parse_args(argv)
    lines = load(args.csv)
    total = sum(c for _, c, _ in lines)
    per = (lambda n: f"{n / args.warps:.0f}") if args.warps else (lambda n: "-")
    print(f"# {args.csv}: {total:,} warp instructions" + (f", {total / args.warps:,.0f} a warp" if args.warps else ""))
    print("| opcode | executed | share | a warp | stall samples |")
    print("|---|---|---|---|---|")
    stalls = collections.Counter()
    for op, _, s in lines:
        stalls[op] += s
    for op, n in mix(lines).most_common(20):
        print(f"| {op} | {n:,} | {100 * n / total:.1f}% | {per(n)} | {stalls[op]} |")
    print()
    print("| times each ran | SASS lines | share of the dynamic total | a warp | most common opcodes (lines) |")
    print("|---|---|---|---|---|")
    for r in by_count(lines)[: args.rows]:
        ops = ", ".join(f"{op} {k}" for op, k in r["ops"])
        print(f"| {r['count']:,} | {r['lines']} | {100 * r['share']:.1f}% | {per(r['count'] * r['lines'])} | {ops} |")


if __name__ == "__main__":
    main()

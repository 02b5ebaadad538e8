"""The decode loop's schedule, compiled from decode.cu for the host (no GPU): which positions of the order each
chunk holds and which of them each warp attends.

decode.cu walks the order chunk by chunk with a handful of integer functions (``boundary_end``, ``first_position``,
``next_position``, and ``stream_position`` for the windowed stream that loads positions ahead). They take no CUDA
type, so the test cuts them out of the kernel's own source, compiles them with the host's C++ compiler and checks,
over every small case: the chunk boundaries are psa_ref's (``progressive.split_chunks``: the forced blocks, the
first ranked chunk, then ``step`` at a time); the warps' positions cover each chunk once; and the windowed stream's
entry m is the walk's m-th position. verifier.cuh's ``chunk_end`` / ``chunk_start`` / ``chunks_before`` (the
speculative schedule's) likewise. A change to the walk that drops or repeats a block would otherwise show only as a
wrong output on a GPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from psa_ref.progressive import split_chunks

CXX = shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")

FUNCTIONS = ("boundary_end", "first_position", "next_position", "stream_position", "stream_entry", "chunk_end",
             "chunk_start", "chunks_before")

HARNESS = r"""
#include <algorithm>
#include <cstdio>
using std::min;
#define __device__
#define __forceinline__ inline
%s
// Each input line: n first first2 step nw. Prints the chunk ends the loop walks ("B ends..."), verifier.cuh's
// arithmetic per position ("C ..."), then per warp its positions as the consumer walks them, each with the windowed
// stream's entry of the same index, and the stream's entry after the last ("W gw p:s ... end:s").
int main() {
    int n, first, first2, step, nw;
    while (std::scanf("%%d %%d %%d %%d %%d", &n, &first, &first2, &step, &nw) == 5) {
        std::printf("B");
        for (int pos = 0; pos < n;) {
            const int end = boundary_end(pos, first, first2, step, n);
            std::printf(" %%d", end);
            pos = end;
        }
        std::printf("\n");
        // verifier.cuh's schedule (the speculative schedule and its verifier, the offload decoder): per position x
        // its chunk's end, the start of chunk x, the chunks starting before x (x = 0 .. n)
        std::printf("C");
        for (int x = 0; x <= n; ++x)
            std::printf(" %%d,%%d,%%d", x < n ? chunk_end(x, first, first2, step, n) : n,
                        chunk_start(x, first, first2, step), chunks_before(x, first, first2, step));
        std::printf("\n");
        for (int gw = 0; gw < nw; ++gw) {
            std::printf("W %%d", gw);
            int e = 0, m = 0;
            for (int cur = first_position(gw, 0, e, first, first2, step, n); cur < n; ++m) {
                std::printf(" %%d:%%d", cur, stream_position(m, 0, gw, nw, first, first2, step, n));
                e = min(e, n);
                cur = next_position(cur, e, gw, nw, first, first2, step, n);
            }
            std::printf(" end:%%d\n", stream_position(m, 0, gw, nw, first, first2, step, n));
        }
        // stream_entry's warp and entry for each position ("E gw:m ...")
        std::printf("E");
        for (int p = 0; p < n; ++p) {
            int gw = -1;
            const int m = stream_entry(p, nw, first, first2, step, n, gw);
            std::printf(" %%d:%%d", gw, m);
        }
        std::printf("\n");
    }
    return 0;
}
"""


def kernel_functions() -> str:
    """The schedule's functions, as decode.cu defines them (each from its signature to its closing brace)."""
    from psa_fast import _kernels

    src = _kernels._source("decode.cu")
    parts = []
    for name in FUNCTIONS:
        m = re.search(r"^__device__ __forceinline__ int " + name + r"\(.*?^\}$", src, re.S | re.M)
        assert m, f"{name} not found in decode.cu"
        parts.append(m.group(0))
    return "\n\n".join(parts)


@pytest.fixture(scope="module")
def schedule(tmp_path_factory):
    """A function running the compiled harness on cases ``(n, first, first2, step, nw)``: per case the chunk ends the
    loop walks, verifier.cuh's
    ``(chunk_end(x), chunk_start(x), chunks_before(x))`` for x = 0 .. n (the first n for x = n), and per warp its
    walked positions, the stream's entries beside them and its entry past them, and per position
    ``stream_entry``'s warp and entry."""
    folder = tmp_path_factory.mktemp("schedule")
    (folder / "schedule.cpp").write_text(HARNESS % kernel_functions())
    subprocess.run([CXX, "-O1", "-std=c++17", "-o", str(folder / "schedule"), str(folder / "schedule.cpp")],
                   check=True)

    def run(cases):
        text = "\n".join(" ".join(map(str, c)) for c in cases) + "\n"
        lines = subprocess.run([str(folder / "schedule")], input=text, capture_output=True, text=True,
                               check=True).stdout.splitlines()
        out, i = [], 0
        for case in cases:
            ends = [int(x) for x in lines[i].split()[1:]]
            warps = []
            verifier = [tuple(int(x) for x in t.split(",")) for t in lines[i + 1].split()[1:]]
            for line in lines[i + 2: i + 2 + case[4]]:
                *pairs, end = line.split()[2:]
                walked = [tuple(int(x) for x in p.split(":")) for p in pairs]
                warps.append(([p for p, _ in walked], [s for _, s in walked], int(end.split(":")[1])))
            entries = [tuple(int(x) for x in t.split(":")) for t in lines[i + 2 + case[4]].split()[1:]]
            out.append((ends, verifier, warps, entries))
            i += 3 + case[4]
        return out

    return run


def cases():
    """Every small schedule: n blocks, first forced, a first ranked chunk ending at first2 (or none), step, warps."""
    out = []
    for n in (1, 2, 3, 5, 8, 13, 37):
        for first in sorted({0, 1, min(3, n), n}):
            for first2 in sorted({first, min(n, first + 1), min(n, first + 4), n}):
                for step in (1, 2, 5, 16):
                    for nw in (1, 3, 4, 8):
                        out.append((n, first, first2, step, nw))
    return out


def test_the_loop_walks_the_references_chunks_and_each_warp_its_share(schedule):
    """Per case: the chunk ends the loop walks are psa_ref's chunks of the order (``split_chunks``); every position
    of a chunk is attended by exactly one warp, during that chunk; and the windowed stream's entries are each warp's
    walk, ``n`` past its end."""
    todo = cases()
    for case, (ends, _, warps, _) in zip(todo, schedule(todo)):
        n, first, first2, step, nw = case
        ref = [int(c[-1]) + 1 for c in split_chunks(np.arange(n), first, step, first2 - first)]
        assert ends == ref, (case, ends, ref)
        starts = [0] + ends[:-1]
        seen = np.zeros(n, int)
        for gw, (walked, streamed, past) in enumerate(warps):
            assert streamed == walked and past == n, (case, gw, walked, streamed, past)
            assert walked == sorted(walked), (case, gw)
            for p in walked:
                seen[p] += 1
                c = int(np.searchsorted(ends, p, side="right"))  # the chunk [starts[c], ends[c]) holding p
                assert (p - starts[c]) % nw == gw, (case, gw, p)  # warp gw takes the chunk's gw-th, + nw, ...
        assert (seen == 1).all(), (case, seen.tolist())


def test_the_harness_reads_the_kernels_functions():
    """The cut is decode.cu's own code: each function is found once, with its body (a change of its signature or
    of the source's layout fails here, not silently in the walk)."""
    text = kernel_functions()
    for name in FUNCTIONS:
        assert text.count(f"int {name}(") == 1
    assert "return min(e < first ? first : e < first2 ? first2 : e + step, n);" in text


def test_the_verifiers_schedule_is_the_references(schedule):
    """verifier.cuh's ``chunk_end`` / ``chunk_start`` / ``chunks_before`` (the speculative schedule, its verifier and
    the offload decoder find a chunk from a position, or a position from a chunk, without walking): on every case,
    the end of the chunk holding each position, the start of each chunk and the count of chunks starting before each
    position are those of psa_ref's chunks (``split_chunks``; these builds keep the forced chunk apart)."""
    todo = [c for c in cases() if c[4] == 1]  # (warps do not enter these functions)
    for case, (_, verifier, _, _) in zip(todo, schedule(todo)):
        n, first, first2, step = case[:4]
        chunks = split_chunks(np.arange(n), first, step, first2 - first)
        starts = [int(c[0]) for c in chunks]
        for x, (end, start, before) in enumerate(verifier):
            if x < n:
                holder = next(c for c in chunks if x <= c[-1])
                assert end == int(holder[-1]) + 1, (case, x, end)
            if x < len(chunks):
                assert start == starts[x], (case, x, start)
            assert before == sum(s < x for s in starts), (case, x, before)


def test_stream_entry_finds_the_warp_and_entry_that_attend_each_position(schedule):
    """``stream_entry`` inverts the windowed stream: for every position p of every case it names the warp gw and the
    entry m with ``stream_position(m, 0, gw, ...) == p`` (the fused step's placing CTAs write each of the first
    window's positions where that warp's lane m reads it, so a wrong inverse would hand a warp another's block)."""
    todo = cases()
    for case, (_, _, warps, entries) in zip(todo, schedule(todo)):
        n = case[0]
        assert len(entries) == n, case
        for p, (gw, m) in enumerate(entries):
            streamed = warps[gw][1]
            assert 0 <= m < len(streamed) and streamed[m] == p, (case, p, gw, m)

"""A model of the look-ahead's exchange between a group's CTAs (decode.cu's PSA_LOOKAHEAD), run under random
interleavings on the CPU: what buffers and counters the protocol needs, checked before any device time.

With the look-ahead each pass of a CTA attends chunk c, publishes it (its statistics; on the grid also every warp's
output terms and an arrival at a counter), then waits for and decides chunk c - 1; a stop drops chunk c. A CTA can
therefore run ahead of a slow one by up to two arrivals, and what it overwrites must no longer be read:

* grid build: the statistics of an iteration in ``buffers`` slots (``xstats``) and arrivals at one counter, or at two by
  the chunk's parity; the finish reads every warp's terms of the decided chunk (two slots, ``xpart``), and every CTA
  waits for all arrivals before the last one out resets the counters;
* clusters: the hardware barrier alternates arrive / wait per thread (a CTA arrives after its decision), statistics in
  ``buffers`` slots (``cta_stats``).

Each run checks that every decision reads the statistics of its own chunk from every CTA, the finish the terms of the
decided chunk, that all CTAs stop at the same chunk as the plain loop would, and that the counters end at zero.

    python benchmarks/lookahead_protocol.py          # failures of each variant over 20,000 random runs
"""

from __future__ import annotations

import argparse
import random


def boundary_end(e: int, first: int, first2: int, step: int, n: int) -> int:
    """decode.cu's boundary_end: the end of the chunk that starts at position ``e``."""
    return min(first if e < first else first2 if e < first2 else e + step, n)


def plain_stop(n: int, first: int, first2: int, step: int, stop_after: int) -> tuple[int, int]:
    """(position, iterations) where the plain loop stops: the chunk ending at n, or the one after ``stop_after``
    decisions."""
    pos = it = 0
    while True:
        end = boundary_end(pos, first, first2, step, n)
        pos, it = end, it + 1
        if end >= n or it > stop_after:
            return pos, it


def _schedule(gens: list, rng: random.Random) -> None:
    live = list(range(len(gens)))
    while live:
        r = rng.choice(live)
        try:
            next(gens[r])
        except StopIteration:
            live.remove(r)


def _read_stats(stats: list, it: int, r: int):
    """CTA ``r`` reads every CTA's statistics of chunk ``it`` (one step each), checking they are that chunk's."""
    slot = stats[it % len(stats)]
    for q in range(len(slot)):
        assert slot[q] == it, f"CTA {r} read chunk {slot[q]} for {it}"
        yield


def grid_run(ctas: int, n: int, first: int, first2: int, step: int, stop_after: int, rng: random.Random, *,
             buffers: int = 4, parity_counters: bool = True) -> tuple[int, int]:
    """One launch of a group of ``ctas`` CTAs on the grid build's look-ahead; returns the common (position,
    iterations). Raises AssertionError where a CTA reads another chunk's statistics or terms, the CTAs disagree, or a
    counter does not end at zero."""
    counters, out = [0, 0], [0]
    stats = [[None] * ctas for _ in range(buffers)]
    terms = [[None] * ctas for _ in range(2)]
    ends = []

    def counter(c: int) -> int:
        return c & 1 if parity_counters else 0

    def arrived(c: int) -> int:  # the count at which every CTA has arrived at chunk c
        return ctas * (c // 2 + 1) if parity_counters else ctas * (c + 1)

    def cta(r: int):
        pos = it = c_pos = c_it = published = 0
        why = -1
        while why < 0:
            c_end = boundary_end(c_pos, first, first2, step, n)
            for _ in range(rng.randint(0, 3)):  # attend
                yield
            if c_pos < n or c_it == 0:  # publish
                terms[c_it & 1][r] = c_it
                yield
                stats[c_it % buffers][r] = c_it
                yield
                counters[counter(c_it)] += 1
                published += 1
                yield
            end, deciding = c_pos, c_it > it
            c_pos, c_it = c_end, c_it + 1
            if deciding:
                while counters[counter(it)] < arrived(it):
                    yield
                yield from _read_stats(stats, it, r)
                why = 1 if end >= n else 0 if it >= stop_after else -1
                pos, it = end, it + 1
        for q in range(ctas):  # the finish: every warp's terms of the decided chunk
            assert terms[(it - 1) & 1][q] == it - 1, f"CTA {r} combined chunk {terms[(it - 1) & 1][q]}'s terms"
            yield
        if parity_counters:
            while counters[0] < ctas * ((published + 1) // 2) or counters[1] < ctas * (published // 2):
                yield
        else:
            while counters[0] < ctas * published:
                yield
        out[0] += 1
        if out[0] == ctas:  # the last CTA out resets the counters
            counters[0] = counters[1] = out[0] = 0
        ends.append((pos, it))

    _schedule([cta(r) for r in range(ctas)], rng)
    assert len(set(ends)) == 1, f"the CTAs stopped at {ends}"
    assert counters == [0, 0], f"counters left at {counters}"
    return ends[0]


def cluster_run(ctas: int, n: int, first: int, first2: int, step: int, stop_after: int, rng: random.Random, *,
                buffers: int = 3) -> tuple[int, int]:
    """The same on clusters: statistics in ``buffers`` slots of shared memory, the hardware barrier (a wait returns
    once every CTA has arrived as often as this one)."""
    arrivals = [0] * ctas
    stats = [[None] * ctas for _ in range(buffers)]
    ends = []

    def cta(r: int):
        pos = it = c_pos = c_it = 0
        why = -1
        while why < 0:
            c_end = boundary_end(c_pos, first, first2, step, n)
            for _ in range(rng.randint(0, 3)):
                yield
            if c_pos < n or c_it == 0:
                stats[c_it % buffers][r] = c_it
                yield
            end, deciding = c_pos, c_it > it
            c_pos, c_it = c_end, c_it + 1
            if deciding:
                while min(arrivals) < arrivals[r]:
                    yield
                yield from _read_stats(stats, it, r)
                why = 1 if end >= n else 0 if it >= stop_after else -1
                pos, it = end, it + 1
            if why < 0:
                arrivals[r] += 1
                yield
        ends.append((pos, it))

    _schedule([cta(r) for r in range(ctas)], rng)
    assert len(set(ends)) == 1, f"the CTAs stopped at {ends}"
    return ends[0]


def failures(run, trials: int, seed: int, **variant) -> int:
    """Runs of ``run`` (grid_run or cluster_run) over random groups (2-5 CTAs), chunk layouts and stops that fail
    (a wrong read, CTAs that disagree, counters left over, or a stop other than the plain loop's)."""
    rng = random.Random(seed)
    bad = 0
    for _ in range(trials):
        n = rng.randint(0, 40)
        first = min(n, rng.randint(0, 4))
        first2 = min(n, first + rng.randint(0, 8))
        step, stop_after, ctas = rng.randint(1, 9), rng.randint(0, 10), rng.randint(2, 5)
        try:
            got = run(ctas, n, first, first2, step, stop_after, rng, **variant)
            assert got == plain_stop(n, first, first2, step, stop_after)
        except AssertionError:
            bad += 1
    return bad


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("| build | statistics buffers | counters | failed runs |")
    print("|---|---|---|---|")
    for buffers in (2, 3, 4):
        for parity in (False, True):
            bad = failures(grid_run, args.trials, args.seed, buffers=buffers, parity_counters=parity)
            print(f"| grid | {buffers} | {'two, by parity' if parity else 'one'} | {bad} of {args.trials} |")
    for buffers in (2, 3):
        bad = failures(cluster_run, args.trials, args.seed, buffers=buffers)
        print(f"| clusters | {buffers} | the hardware barrier | {bad} of {args.trials} |")


if __name__ == "__main__":
    main()

"""The ways `_kernels.order` orders the groups (issue 14, item 2): counting every block's position over many
CTAs (`psa_order_rank`, by carry or by compares, one or four blocks a lane), one CTA sorting a group by bitonic
merges (`psa_order`) or by radix passes (`psa_order_radix`), slices + merge (`psa_order_slice` +
`psa_order_merge`), and runs of 256 sorted by warps and merged in the same launch (`psa_order_runs`), per batch,
group count and blocks a group. Median µs a call, 16 calls captured in one CUDA graph; each row also checks that the
orders agree, and marks the method `order_method` picks (*).

    python benchmarks/exp_order_rank.py [--shapes 1x1x2048,8x8x2048]
"""

import argparse

import numpy as np

SHAPES = ("1x1x2048,8x1x2048,32x1x2048,1x1x8192,4x1x8192,1x8x2048,4x8x2048,8x8x2048,1x8x4096,1x8x8192,"
          "1x32x1024,8x8x512,32x8x512,8x8x8192,32x8x8192,32x1x8192,32x8x2048")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="B x Gn x blocks a group, comma-separated")
    args = ap.parse_args()

    import cupy

    from bench_decode import capture, median_us
    from psa_fast import _kernels

    stream = cupy.cuda.Stream(non_blocking=True)
    rs = np.random.default_rng(0)
    print("| B x Gn | blocks | pairs (M) | rank (carry) | rank (4 a lane) | rank (compare) | sort | slices | radix "
          "| runs | picked |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        b, gn, nmax = (int(x) for x in shape.split("x"))
        with stream:
            scores = cupy.asarray(rs.standard_normal((b, gn, nmax)).astype(np.float32) * 0.5 + 3)
            seq = cupy.full((b,), nmax * 16, cupy.int32)
            ws_shape = _kernels.order_workspace_shape(b, gn, nmax)
            ws = None if ws_shape is None else cupy.empty(ws_shape, cupy.uint64)
            tiles = -(-nmax // 32)

            def rank(carry, own=1):
                fn = _kernels.kernel("order_rank", d=16, s=16, g=1, warps=_kernels.RANK_WARPS, rank_carry=carry,
                                     rank_own=own)
                return lambda out: fn((-(-tiles // own), gn, b), (_kernels.RANK_WARPS * 32,),
                                      (scores, seq, out, np.int32(nmax), np.int32(1), np.int32(1)),
                                      shared_mem=tiles * 128)

            def method(m):
                return lambda out: _kernels.order(scores, seq, out, None, None, s=16, g=1, hq=gn, nmax=nmax,
                                                  sink_blocks=1, recent_blocks=1, want_suffix=False, workspace=ws,
                                                  method=m)

            fits = nmax <= _kernels.RANK_MAX_BLOCKS
            radix_fits = _kernels._pow2(nmax, 2) <= _kernels.RADIX_MAX_BLOCKS
            runs = {"rank1": rank(1) if fits else None, "rank4": rank(1, 4) if fits else None,
                    "rank0": rank(0) if fits else None, "sort": method("sort"),
                    "slices": method("slices") if ws is not None else None,
                    "radix": method("radix") if radix_fits else None,
                    "runs": method("runs") if nmax <= _kernels.RUNS_MAX_BLOCKS else None}  # "—": does not apply
            times, outs = {}, {}
            for name, fn in runs.items():
                if fn is None:
                    times[name] = None
                    continue
                out = cupy.full((b, gn, nmax), -7, cupy.int32)
                fn(out)
                outs[name] = cupy.asnumpy(out)

                def many(fn=fn, out=out):
                    for _ in range(16):
                        fn(out)
                gr = capture(many, stream)
                gr.launch(stream)
                times[name] = median_us(lambda i: gr.launch(stream), stream, 20, 1) / 16
            ref = outs["sort"]
            bad = [k for k, v in outs.items() if not np.array_equal(v, ref)]
            picked = _kernels.order_method(b, gn, nmax, workspace=ws is not None)
            cell = {k: "—" if v is None else f"{v:.1f}" for k, v in times.items()}
            mark = {"rank": "rank1", "sort": "sort", "slices": "slices", "radix": "radix", "runs": "runs"}[picked]
            cell[mark] += " *"
            print(f"| {b} x {gn} | {nmax} | {b * gn * nmax * nmax / 1e6:.0f} | {cell['rank1']} | {cell['rank4']} | "
                  f"{cell['rank0']} | "
                  f"{cell['sort']} | {cell['slices']} | {cell['radix']} | {cell['runs']} | "
                  f"{picked}{' MISMATCH ' + ','.join(bad) if bad else ''} |",
                  flush=True)


if __name__ == "__main__":
    main()

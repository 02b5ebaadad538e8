"""Where the head-of-order kernel's time goes (issue 14, item 2): psa_order_head whole, without its
radix select (PSA_SKIP=1) and without its sort (PSA_SKIP=2), against the full sort, per group count
and head size. Median µs per call, 16 calls captured in one CUDA graph.

    python benchmarks/exp_select.py
"""

import numpy as np


def main() -> None:
    import cupy

    from bench_decode import capture, median_us
    from psa_fast import _kernels

    stream = cupy.cuda.Stream(non_blocking=True)
    rs = np.random.default_rng(0)
    print(f"{'B x Gn':>7} {'N':>6} {'K':>5} {'full sort':>10} {'head':>8} {'no select':>10} {'no sort':>8}")
    for b, gn, nmax, head in [(1, 8, 8192, 328), (1, 8, 8192, 2048), (8, 8, 8192, 328), (1, 8, 2048, 82),
                              (1, 1, 2048, 82), (1, 8, 16384, 656)]:
        with stream:
            scores = cupy.asarray(rs.standard_normal((b, gn, nmax)).astype(np.float32) * 0.5 + 3)
            seq = cupy.full((b,), nmax * 16, cupy.int32)
            out = cupy.empty((b, gn, nmax), cupy.int32)
            ws_shape = _kernels.order_workspace_shape(b, gn, nmax)
            ws = None if ws_shape is None else cupy.empty(ws_shape, cupy.uint64)

            def us(fn):
                def many():
                    for _ in range(16):
                        fn()
                gr = capture(many, stream)
                gr.launch(stream)
                return median_us(lambda i: gr.launch(stream), stream, 20, 1) / 16

            def head_fn(skip):
                npad_n = _kernels._pow2(nmax, 1024)
                npad = _kernels._pow2(head, 1024)
                fn = _kernels.kernel("select", d=16, s=16, g=1, npad=npad, npad_n=npad_n, entry="order_head",
                                     skip=skip)
                if npad * 8 > 48 * 1024:
                    fn.max_dynamic_shared_size_bytes = npad * 8
                return lambda: fn((gn, b), (1024,), (scores, seq, out, np.int32(nmax), np.int32(0), np.int32(0),
                                                     np.int32(head)), shared_mem=npad * 8)

            full = us(lambda: _kernels.order(scores, seq, out, None, None, s=16, g=1, hq=gn, nmax=nmax, sink_blocks=0,
                                             recent_blocks=0, want_suffix=False, workspace=ws))
            t = [us(head_fn(s)) for s in (0, 1, 2)]
            print(f"{b:>3} x {gn:<2} {nmax:>6} {head:>5} {full:>10.1f} {t[0]:>8.1f} {t[1]:>10.1f} {t[2]:>8.1f}",
                  flush=True)


if __name__ == "__main__":
    main()

"""Quick end-to-end check of psa_fast on a GPU: every kernel once, against the reference.

    python benchmarks/smoke.py
"""

import time

import numpy as np


def main() -> None:
    import cupy

    import psa_fast
    import psa_ref
    from psa_ref.testing.conformance import check_result

    rng = np.random.default_rng(0)
    q, k, v = psa_ref.testing.random_problem(rng, num_q_heads=32, num_kv_heads=8, num_tokens=3000, head_dim=128,
                                             logit_scale=2.0, dtype=np.float16)
    t0 = time.perf_counter()
    blocks = psa_fast.KVBlocks.from_dense(cupy.asarray(k), cupy.asarray(v), block_size=16)
    print(f"KVBlocks.from_dense (Numba metadata, first call compiles): {time.perf_counter() - t0:.1f} s", flush=True)
    for stop in psa_fast.STOP_RULES:
        t0 = time.perf_counter()
        res = psa_fast.attention(cupy.asarray(q), blocks, 0.9, stop=stop, step=16)
        host = psa_ref.AttentionResult(cupy.asnumpy(res.output), res.blocks_used, res.iterations, res.stop_reason,
                                       res.mass_estimate, None, res.num_blocks)
        c = check_result(host, q, k, v, threshold=0.9, stop=stop, step=16)
        print(f"psa {stop:>9}: {time.perf_counter() - t0:.1f} s, blocks {[b.size for b in res.blocks_used]}, "
              f"same as reference {c.same_blocks}, output err {c.max_output_err:.2e} (tol {c.output_tol:.2e})",
              flush=True)
    # how far the GPU's float16-metadata estimates are from the reference's float64 ones
    plan = psa_fast.plan(blocks.cache, num_q_heads=32, threshold=0.9, step=16)
    plan.run(cupy.asarray(q[None]))
    ref_scores = psa_ref.estimate(q.astype(np.float64), psa_ref.KVBlocks.from_dense(k, v, block_size=16),
                                  1 / np.sqrt(128)).reshape(8, 4, -1).max(axis=1)
    gpu_scores = cupy.asnumpy(plan.scores[0])
    same_order = sum(np.array_equal(np.argsort(-a, kind="stable"), np.argsort(-b, kind="stable"))
                     for a, b in zip(gpu_scores, ref_scores))
    print(f"estimates: max |gpu - ref| {np.abs(gpu_scores - ref_scores).max():.2e}, spread of ref "
          f"{ref_scores.std():.2e}, order identical in {same_order}/8 groups", flush=True)
    res = psa_fast.topk_attention(cupy.asarray(q), blocks, 20)
    host = psa_ref.AttentionResult(cupy.asnumpy(res.output), res.blocks_used, res.iterations, res.stop_reason,
                                   res.mass_estimate, None, res.num_blocks)
    c = check_result(host, q, k, v, method="topk", k=20)
    print(f"topk: same as reference {c.same_blocks}, err {c.max_output_err:.2e}", flush=True)
    out = cupy.asnumpy(psa_fast.dense_attention(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v)))
    print(f"dense: max abs err vs psa_ref {np.abs(out - psa_ref.dense_attention(q, k, v)).max():.2e}", flush=True)


if __name__ == "__main__":
    main()

"""One decode step of a sliding-window layer, several ways, on the GPU: time (median of CUDA graph replays,
CUDA events) and error against float64.

Gemma 3 270M's window layers: B requests, Hq 4 / Hkv 1, head dim 256, a ring of 512 slots (bfloat16).
Each time is bench_multi_gpu's ``median_us`` (a CUDA graph of several calls, so the host's launch latency is
amortised; the run of record of 2026-12-01 captured one call per graph, its times include ~3.5 µs of launch).
Variants:

* ``sdpa_mask``: stock SDPA with the ring's [1, 1, 1, S] bool mask (what the eager step runs; cuDNN on H200);
* ``broadcast_compiled``: ``psa_fast.hf.window_decode_attention`` through ``torch.compile`` (broadcast
  products and sums);
* ``bmm_compiled``: the same function with ``products="bmm"`` (the two products as cuBLAS batched products
  with float32 results, softmax and mask fused by inductor);
* ``sdpa_nomask``: SDPA without a mask (valid once the ring is full: every slot is in the window);
* ``flex_compiled``: ``flex_attention`` with the mask as a ``score_mod`` over the slots' positions
  (flex decoding's split-KV kernel).

    python benchmarks/exp_window_attention.py --batches 1,8,32 --out window.jsonl
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    from bench_multi_gpu import median_us
    from psa_fast.hf import decode_allowed, window_decode_attention

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--length", type=int, default=32768, help="tokens written (the ring is full past --window)")
    ap.add_argument("--out", default="window.jsonl")
    args = ap.parse_args()
    hq, hkv, d, w = 4, 1, 256, args.window
    scale = 256 ** -0.5  # Gemma 3 270M's query_pre_attn_scalar
    torch.manual_seed(0)
    compiled = torch.compile(window_decode_attention, dynamic=False)
    flex = torch.compile(flex_attention, dynamic=False)
    for b in [int(x) for x in args.batches.split(",")]:
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, w, d, device="cuda", dtype=torch.bfloat16) * 2
        v = torch.randn(b, hkv, w, d, device="cuda", dtype=torch.bfloat16)
        length = torch.tensor(args.length, device="cuda")
        positions = torch.arange(args.length - w, args.length, device="cuda")
        positions = positions[(torch.arange(w, device="cuda") - args.length) % w]  # slot = position mod w
        allowed = decode_allowed(positions, length, w)
        mask = allowed.view(1, 1, 1, -1)

        def mod(score, bb, h, qi, kv):
            return torch.where(allowed[kv], score, -float("inf"))

        ref_logits = (q.double().reshape(b, hkv, hq // hkv, d) @ k.double().transpose(-1, -2)) * scale
        ref_logits = ref_logits.masked_fill(~allowed, float("-inf"))
        ref = (torch.softmax(ref_logits, -1) @ v.double()).reshape(b, 1, hq, d)
        variants = {
            "sdpa_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                                enable_gqa=True).transpose(1, 2),
            "sdpa_nomask": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale,
                                                                  enable_gqa=True).transpose(1, 2),
            "broadcast_compiled": lambda: compiled(q, k, v, positions, length, w, scale, "broadcast"),
            "bmm_compiled": lambda: compiled(q, k, v, positions, length, w, scale, "bmm"),
            "flex_compiled": lambda: flex(q, k, v, score_mod=mod, scale=scale, enable_gqa=True).transpose(1, 2),
        }
        bytes_read = 2 * b * hkv * w * d * 2
        for name, fn in variants.items():
            try:
                out = fn()
                err = float((out.double() - ref).abs().max())
                us, _ = median_us(fn, 200)
            except Exception as exc:  # a variant this torch cannot run: say so, go on
                print(f"B={b:3d} {name:20s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            row = dict(batch=b, variant=name, us=us, max_abs_err=err, gbs=bytes_read / us / 1e3)
            print(f"B={b:3d} {name:20s} {us:8.2f} us  {row['gbs']:7.0f} GB/s  max err {err:.2e}", flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

"""psa_fast: Progressive Sparse Attention on NVIDIA GPUs (CuPy + Numba CUDA, Hopper sm_90).

The same functions and results as ``psa_ref``, on GPU arrays (CuPy or CUDA torch tensors,
exchanged through DLPack without copies), plus a batched decode path over a paged KV cache::

    import psa_fast
    blocks = psa_fast.KVBlocks.from_dense(keys, values, block_size=16)   # keys: [Hkv, T, D] float16 on GPU
    res = psa_fast.attention(q, blocks, threshold=0.95, step=64)

    cache = psa_fast.PagedKVCache(num_layers=32, batch=8, num_kv_heads=8, head_dim=128, max_tokens=131072)
    plan = psa_fast.plan(cache, num_q_heads=32, threshold=0.95, step=64)
    out = plan.run(q, layer=0).out                                        # no host synchronisation

``import psa_fast`` works without a GPU; calling into it there raises a clear ``RuntimeError``.
"""

from ._compat import gpu_available
from ._kernels import REASONS, STOP_RULES
from .api import DecodeOutput, DecodePlan, KVBlocks, attention, dense_attention, plan, topk_attention
from .cache import PagedKVCache

__all__ = [
    "DecodeOutput",
    "DecodePlan",
    "KVBlocks",
    "PagedKVCache",
    "REASONS",
    "STOP_RULES",
    "attention",
    "dense_attention",
    "gpu_available",
    "plan",
    "topk_attention",
]

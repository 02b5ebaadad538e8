"""psa_ref: the readable NumPy reference of Progressive Sparse Attention (arXiv 2503.00392).

Pinned API::

    import psa_ref
    blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=16, metadata="cuboid_mean")
    res = psa_ref.attention(q, blocks, threshold=0.95)    # Algorithm 1
    res = psa_ref.topk_attention(q, blocks, k=8)          # fixed-budget baseline
    out = psa_ref.dense_attention(q, keys, values)        # full attention

Everything is computed in float64 from plain NumPy operations; the GPU backend
``psa_fast`` is tested against this package, never the other way round.
"""

from .blocks import METADATA_KINDS, KVBlocks, KVLayoutWarning
from .dense import dense_attention
from .scoring import estimate, rank, upper_bound
from .progressive import STOP_RULES, SketchMetadataWarning, attention
from .result import AttentionResult
from .topk import topk_attention

__all__ = [
    "AttentionResult",
    "KVBlocks",
    "KVLayoutWarning",
    "METADATA_KINDS",
    "STOP_RULES",
    "SketchMetadataWarning",
    "attention",
    "dense_attention",
    "estimate",
    "rank",
    "topk_attention",
    "upper_bound",
]
__version__ = "0.1.0"

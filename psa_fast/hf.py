"""The GPU backend of the transformers integration: ``psa_ref.tools.hf`` with decode steps on ``psa_fast``.

The reference integration (``psa_ref.tools.hf``) runs each decode step through the NumPy
reference; this module registers the backend ``"fast"`` there, which runs the same step through
[`psa_fast.attention`][psa_fast.attention] / [`psa_fast.topk_attention`][psa_fast.topk_attention] on the model's CUDA
tensors::

    import psa_fast.hf
    from psa_ref.tools.hf import PSAConfig
    session = psa_fast.hf.enable(model, PSAConfig(threshold=0.95))   # model on a CUDA device
    out = model.generate(ids, max_new_tokens=32)

Each step rebuilds the blocks' metadata on the GPU from the layer's whole cache (float16);
the reference never imports this package.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from psa_ref.tools import hf as _hf

from ._compat import gpu_available


def decode_step(session, layer: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                scaling: float) -> torch.Tensor:
    """One sequence's decode step: ``q [Hq, D]``, ``key, value [Hkv, T, D]`` CUDA tensors -> ``[Hq, D]``.

    Metadata is rebuilt on the GPU from the whole cache; K, V and q are read as float16."""
    import psa_fast

    cfg = session.config
    blocks = psa_fast.KVBlocks.from_dense(key.half().contiguous(), value.half().contiguous(),
                                          block_size=cfg.block_size, metadata=cfg.metadata, kv_layout="HND")
    common = dict(scale=scaling, gqa=cfg.gqa, sink_blocks=cfg.sink_blocks, recent_blocks=cfg.recent_blocks)
    if cfg.topk is not None:
        res = psa_fast.topk_attention(q.half().contiguous(), blocks, cfg.topk, **common)
    else:
        res = psa_fast.attention(q.half().contiguous(), blocks, cfg.threshold, stop=cfg.stop, step=cfg.step, **common)
    if cfg.record:
        hq, hkv = q.shape[0], key.shape[0]
        g = hq // hkv
        used = [np.asarray(u) for u in (res.blocks_used if isinstance(res.blocks_used, list) else [res.blocks_used])]
        per_head = used if cfg.gqa == "per_head" else [used[h // g] for h in range(hq)]
        session._head_dim = key.shape[2]
        session.records.append(_hf.step_record(layer, key.shape[1], cfg.block_size, per_head, hkv))
    return torch.as_tensor(res.output, device=q.device)


def register() -> None:
    """Register ``attn_implementation="psa"`` with transformers and the ``"fast"`` backend."""
    _hf.register()
    _hf.register_backend("fast", decode_step)


def enable(model, config: _hf.PSAConfig | None = None) -> _hf.PSASession:
    """[`psa_ref.tools.hf.enable`][psa_ref.tools.hf.enable] with ``backend="fast"`` (a CUDA GPU required).

    Raises:
        RuntimeError: where there is no CUDA GPU (or CuPy is missing).
    """
    if not gpu_available():
        raise RuntimeError("psa_fast.hf needs a CUDA GPU and CuPy (pip install 'psa[gpu]'); on the CPU use "
                           "psa_ref.tools.hf.enable(model, PSAConfig(backend='ref' or 'sweep'))")
    config = _hf.PSAConfig(backend="fast") if config is None else dataclasses.replace(config, backend="fast")
    register()
    return _hf.enable(model, config)

"""Tools around the algorithm and the KV cache manager (layer 3): what the ``psa`` command runs.

* ``psa_ref.tools.cli`` — the ``psa`` command (``psa demo``, ``psa sim``, ``psa eval``);
* ``psa_ref.tools.demo`` — the demo on the shipped real-attention trace;
* ``psa_ref.tools.hf`` — the transformers integration (``attn_implementation="psa"``, CPU
  backends; the GPU backend is ``psa_fast.hf``);
* ``psa_ref.tools.evaluate`` — ``psa eval``: PSA inside a real model against dense and top-k.
* ``psa_ref.tools.tensor_parallel`` — head-parallel decode over ``torch.distributed`` (the reference of
  ``psa_fast.distributed``; gloo on CPUs).

Modules here import the layers below them; nothing below imports them. ``hf`` and
``evaluate`` need the ``hf`` extra (torch, transformers); ``tensor_parallel`` needs torch when a step runs.
"""

"""A/B of the speculative attend's CTA size: warps per decode CTA for PSA (``_kernels.default_warps`` patched),
one Gemma 3 layer replayed from real K/V (profile_decode_step.py's data and timing).

    python benchmarks/exp_spec_warps.py --warps 8,2,1 -- --kv gemma3_xml_l5_32k.npz --shape gemma3 --batches 32,8 ...
"""

import runpy
import sys

from psa_fast import _kernels

if __name__ == "__main__":
    cut = sys.argv.index("--")
    rest = sys.argv[cut + 1:]
    base = _kernels.default_warps
    for w in (int(x) for x in sys.argv[sys.argv.index("--warps") + 1].split(",")):
        def patched(d, mode, groups=None, w=w):  # the plan passes groups (B x Hkv) as the third argument
            return w if mode == "psa" else base(d, mode, groups)
        _kernels.default_warps = patched
        print(f"# PSA with {w} warps a CTA (before the shared-memory fit)", flush=True)
        sys.argv = ["profile_decode_step.py", *rest]
        runpy.run_path("profile_decode_step.py", run_name="__main__")

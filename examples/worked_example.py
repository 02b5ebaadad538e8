"""The worked example of the tutorial: Algorithm 1 by hand on five blocks.

One head, D = 2, q = (1, 0) and scale 1, so a token's logit is its first key channel.
Ten tokens in blocks of S = 2; the exponentials of their logits are

    B0 (1, 1)   B1 (8, 4)   B2 (2, 2)   B3 (0.5, 0.5)   B4 (4, 2)

Run it:  python examples/worked_example.py
"""

from __future__ import annotations

import numpy as np

import psa_ref
from psa_ref.progressive import update_ema
from psa_ref.testing import log_block_mass, oracle_fractions

# --8<-- [start:data]
EXP_LOGITS = np.array([1, 1, 8, 4, 2, 2, 0.5, 0.5, 4, 2])
keys = np.stack([np.log(EXP_LOGITS), np.zeros(10)], axis=1)  # [T=10, D=2]
values = np.arange(20.0).reshape(10, 2)  # [T, D]
q = np.array([1.0, 0.0])  # [D]
blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=2)
# --8<-- [end:data]


def iteration_table(tau: float = 0.74) -> str:
    """Each rule's estimated attended fraction after each block, as a Markdown table."""
    order = psa_ref.rank(psa_ref.estimate(q[None], blocks, 1.0)[0])
    chunks = [order[i : i + 1] for i in range(order.size)]
    log_mass = log_block_mass(q, keys, 2, 1.0)
    bound = psa_ref.upper_bound(q[None], blocks, 1.0)[0]
    rules = ("seed", "remaining", "certified", "ema")
    rows = ["| after block | AS_acc | AS_min | AS_ema | N_left | seed | remaining | certified | ema |",
            "|---|---|---|---|---|---|---|---|---|"]
    fractions = {rule: oracle_fractions(rule, log_mass, chunks, bound, blocks.block_lengths) for rule in rules}
    mass = np.exp(log_mass)
    ema = None
    for i, j in enumerate(order):
        seen = order[: i + 1]
        ema = update_ema(ema, mass[[j]][None])  # [G=1, chunk=1]
        cells = [f"{fractions[r][i]:.3f}" + (" **stop**" if fractions[r][i] >= tau and
                                              (i == 0 or fractions[r][i - 1] < tau) else "")
                 for r in rules]
        rows.append(f"| B{j} | {mass[seen].sum():g} | {mass[seen].min():g} | {ema[0]:.4g} | {order.size - i - 1} | "
                    + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    print(f"order by estimate: {[f'B{j}' for j in psa_ref.rank(psa_ref.estimate(q[None], blocks, 1.0)[0])]}")
    print(iteration_table())
    print()
    # --8<-- [start:run]
    for stop in ("seed", "certified", "remaining", "ema"):
        res = psa_ref.attention(q, blocks, 0.74, scale=1.0, stop=stop, exact_mass=True)
        print(f"{stop:>9}: blocks {res.blocks_used.tolist()}, estimated mass {res.mass_estimate:.3f}, "
              f"true mass {res.mass_exact:.3f}, output {np.round(res.output, 3).tolist()}")
    # --8<-- [end:run]


if __name__ == "__main__":
    main()

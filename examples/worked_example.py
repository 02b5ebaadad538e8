"""The worked example of the tutorial: Algorithm 1 by hand on five blocks.

One head, D = 2, q = (1, 0) and scale 1, so a token's logit is its first key channel.
Ten tokens in blocks of S = 2; the exponentials of their logits are

    B0 (1, 1)   B1 (8, 4)   B2 (2, 2)   B3 (0.5, 0.5)   B4 (4, 2)

Run it:  python examples/worked_example.py
"""

from __future__ import annotations

# The tutorial shows the marked sections (imports, data, run) as they are: top-level code that runs when copied.
# --8<-- [start:imports]
import numpy as np

import psa_ref

# --8<-- [end:imports]
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
    """Each rule's estimated attended fraction after each block, as a Markdown table: one column per block
    in processing order, one row per quantity (narrow enough for a page)."""
    order = psa_ref.rank(psa_ref.estimate(q[None], blocks, 1.0)[0])
    chunks = [order[i : i + 1] for i in range(order.size)]
    log_mass = log_block_mass(q, keys, 2, 1.0)
    bound = psa_ref.upper_bound(q[None], blocks, 1.0)[0]
    rules = ("seed", "remaining", "certified", "ema")
    fractions = {rule: oracle_fractions(rule, log_mass, chunks, bound, blocks.block_lengths) for rule in rules}
    mass = np.exp(log_mass)
    ema, ema_after = None, []
    for j in order:
        ema = update_ema(ema, mass[[j]][None])  # [G=1, chunk=1]
        ema_after.append(float(ema[0]))
    rows = {
        "AS_acc": [f"{mass[order[: i + 1]].sum():g}" for i in range(order.size)],
        "AS_min": [f"{mass[order[: i + 1]].min():g}" for i in range(order.size)],
        "AS_ema": [f"{e:.4g}" for e in ema_after],
        "N_left": [str(order.size - i - 1) for i in range(order.size)],
        "true fraction": [f"{mass[order[: i + 1]].sum() / mass.sum():.3f}" for i in range(order.size)],
    }
    for r in rules:
        f = fractions[r]
        rows[f"`{r}`"] = [f"{f[i]:.3f}" + (" **stop**" if f[i] >= tau and (i == 0 or f[i - 1] < tau) else "")
                          for i in range(order.size)]
    lines = ["| after block | " + " | ".join(f"B{j}" for j in order) + " |", "|---" * (order.size + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows.items()]
    return "\n".join(lines)


# --8<-- [start:run]
def compare_rules(tau: float = 0.74) -> None:
    """Run Algorithm 1 on the example with each stop rule and print what it attended."""
    for stop in ("seed", "certified", "remaining", "ema"):
        res = psa_ref.attention(q, blocks, tau, scale=1.0, stop=stop, exact_mass=True)
        print(f"{stop:>9}: blocks {res.blocks_used.tolist()}, estimated mass {res.mass_estimate:.3f}, "
              f"true mass {res.mass_exact:.3f}, output {np.round(res.output, 3).tolist()}")
# --8<-- [end:run]


def main() -> None:
    print(f"order by estimate: {[f'B{j}' for j in psa_ref.rank(psa_ref.estimate(q[None], blocks, 1.0)[0])]}")
    print(iteration_table())
    print()
    compare_rules()


if __name__ == "__main__":
    main()

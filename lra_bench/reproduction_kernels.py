"""Does another kernel path train as the counted seeds do? A variant run that differs from its attention's counted
runs only in how its components compute (`KERNEL_CHOICES`: `model.kernels`, `attn.kernel`, `selector.kernel`), held
against their validation curves.

How it is read: a kernel path changes what the network computes at fp32 rounding, and training amplifies rounding
as it amplifies any perturbation, so the run's curve is not expected to stay on its own seed's counted curve. What
matters for the table is that the path moves a curve less than the seed does. At each evaluation the run is held
against the counted run of its own seed, and so are the other counted seeds; the path is within the seeds' spread
when its largest distance from that run, in validation loss and in accuracy, is at most theirs.
(Whether the run lies inside the counted seeds' range is no test with two seeds: where both seeds sit at the class
prior the range is a few 10⁻⁴ wide, and a run that tracks its own seed to 10⁻⁴ falls outside it half the time.)
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from lra_bench.kit.markdown import table
from lra_bench.record.curves import VAL_ACC, VAL_LOSS, evaluations
from lra_bench.record.identity import KERNEL_CHOICES, differing_keys, identity_of, seed_free, under
from lra_bench.reproduction_runs import Run, completed

#: the page's reading of the check (the module's second paragraph, one line)
HOW_READ = " ".join(__doc__.split("\n\n")[1].split())
MIN_SEEDS = 2  # the seeds' spread needs the run's own seed and another


def kernel_keys(run: Run, counted: Sequence[Run]) -> list[str]:
    """The keys `run`'s identity differs in from every one of `counted` (seeds aside), when all of them are kernel
    choices; empty when it differs in anything else (another experiment) or in nothing."""
    keys = differing_keys([seed_free(identity_of(r.record)) for r in (run, *counted)])
    return keys if keys and all(under(k, KERNEL_CHOICES) for k in keys) else []


def _values(frame: pd.DataFrame, step: int, scale: float, digits: int) -> str:
    return ", ".join(f"{scale * v:.{digits}f}" for v in frame.loc[step])


def check(run: Run, counted: Sequence[Run], keys: Sequence[str]) -> list[str]:
    """`run`'s evaluations beside the counted seeds' at the steps they all evaluated, and the verdict (`keys`: what
    it differs in from them, `kernel_keys`)."""
    own, seeds = evaluations(run.folder), {r.seed: evaluations(r.folder) for r in counted}
    steps = sorted(set(own.index).intersection(*(set(s.index) for s in seeds.values())))
    if not steps:
        return [f"`{run.name}`: no evaluation at a step the counted seeds evaluated yet.", ""]
    others = sorted(s for s in seeds if s != run.seed)
    value = {m: own.loc[steps, m] for m in (VAL_LOSS, VAL_ACC)}
    base = {m: seeds[run.seed].loc[steps, m] for m in value}
    rest = {m: pd.DataFrame({s: seeds[s].loc[steps, m] for s in others}) for m in value}
    path = {m: float((value[m] - base[m]).abs().max()) for m in value}
    seed = {m: float(rest[m].sub(base[m], axis=0).abs().max().max()) for m in value}
    rows = [
        [
            step,
            f"{value[VAL_LOSS][step]:.4f}",
            f"{base[VAL_LOSS][step]:.4f}",
            _values(rest[VAL_LOSS], step, 1, 4),
            f"{100 * value[VAL_ACC][step]:.2f}",
            f"{100 * base[VAL_ACC][step]:.2f}",
            _values(rest[VAL_ACC], step, 100, 2),
        ]
        for step in steps
    ]
    s, named = run.seed, ", ".join(map(str, others))
    columns = [f"seed {s} counted", f"seed{'s' if len(others) > 1 else ''} {named}"]
    header = ["step", "val loss", *columns, "val acc %", *columns]
    within = all(path[m] <= seed[m] for m in value)
    identity = identity_of(run.record)
    differs = ", ".join(f"`{k}={identity[k]}`" for k in keys)
    said = (
        f"`{run.name}` ({differs}) over {len(steps)} evaluations: its largest distance from seed {s}'s counted run is "
        f"{path[VAL_LOSS]:.4f} in loss and {100 * path[VAL_ACC]:.2f} pp in accuracy; the other counted seeds' "
        f"({named}) from it {seed[VAL_LOSS]:.4f} and {100 * seed[VAL_ACC]:.2f} pp — "
        + ("**within the seeds' spread**." if within else "**beyond the seeds' spread**.")
    )
    return [*table(header, rows), "", said, ""]


def kernels_section(variant_runs: Sequence[Run], faithful: Sequence[Run]) -> list[str]:
    """For each variant run that differs from its attention's completed counted runs only in kernel choices, with a
    counted run of its own seed and another: its curve against theirs (nothing for a variant of another network)."""
    lines = []
    for run in variant_runs:
        counted = [r for r in completed(faithful, run.attn) if (r.protocol, r.task) == (run.protocol, run.task)]
        seeds = {r.seed for r in counted}
        keys = kernel_keys(run, counted) if run.seed in seeds and len(seeds) >= MIN_SEEDS else []
        if keys:
            lines += check(run, counted, keys)
    if not lines:
        return []
    return ["### Against the counted seeds (the same network, another kernel path)", "", HOW_READ, "", *lines]

"""ListOps generator with the official defaults (LRA `lra_benchmarks/data/listops.py`), seeded.

A tree is a leaf (a digit) with probability 0.75 — always at `max_depth` — or an operator node with
`randint(2, max_args)` children one level deeper. Its length counts operator, end bracket and leaves
(parentheses are not tokens). Trees with `min_length < length < max_length` are kept, duplicates dropped,
and the first `num_train`, next `num_val`, last `num_test` are written as `basic_{train,val,test}.tsv`
with the `Source<TAB>Target` header. Labels: MIN, MAX, MED = int(np.median) (floor of the mean of the two
middle values for even counts), SM = sum mod 10.

Speed: a tree is abandoned as soon as its running length reaches `max_length`; the kept trees have the
same distribution (acceptance depends only on the final length, which only grows), but the generator does
not build the huge trees it would reject. The official file cannot be regenerated bit for bit (its RNG was
unseeded and its split follows Python set order); ours is reproducible from `--seed`.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import sys
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25  # probability of an operator node below max depth


class _TooLong(Exception):
    pass


def apply_op(op: str, values: list[int]) -> int:
    if op == "[MIN":
        return min(values)
    if op == "[MAX":
        return max(values)
    if op == "[SM":
        return sum(values) % 10
    if op == "[MED":
        ordered = sorted(values)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) // 2
    raise ValueError(f"unknown operator {op!r}")


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int, budget: list[int]) -> tuple[str, int]:
    """Return (string, value); `budget[0]` is the remaining length allowance (raises when exhausted)."""
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        budget[0] -= 1
        if budget[0] <= 0:
            raise _TooLong
        value = rng.randrange(10)
        return str(value), value
    budget[0] -= 2
    if budget[0] <= 0:
        raise _TooLong
    num_args = rng.randint(2, max_args)
    children = [_tree(rng, depth + 1, max_depth, max_args, budget) for _ in range(num_args)]
    op = rng.choice(OPERATORS)
    # left-nested pairs: ((((op c0) c1) ...) ]) rendered with explicit parentheses, as the official to_string
    parts = ["( " * (num_args + 1) + op + " " + children[0][0] + " )"]
    parts += [" " + child + " )" for child, _ in children[1:]]
    parts.append(" ] )")
    return "".join(parts), apply_op(op, [v for _, v in children])


def sample(rng: random.Random, max_depth: int, max_args: int, max_length: int) -> tuple[str, int, int] | None:
    """One tree as (string, label, length), or None when it reached `max_length` tokens."""
    budget = [max_length]
    try:
        text, value = _tree(rng, 1, max_depth, max_args, budget)
    except _TooLong:
        return None
    return text, value, max_length - budget[0]


def generate(
    num_samples: int,
    seed: int = 0,
    max_depth: int = 10,
    max_args: int = 10,
    min_length: int = 500,
    max_length: int = 2000,
    progress: bool = True,
    max_tries: int | None = None,
) -> list[tuple[str, int]]:
    """`num_samples` distinct (string, label) pairs with `min_length < length < max_length`."""
    if not 0 <= min_length < max_length - 1:
        raise ValueError(f"need 0 <= min_length < max_length - 1, got min_length={min_length}, max_length={max_length}")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[str, int]] = []
    tries, limit = 0, max_tries or 10_000 * max(num_samples, 1) + 100_000
    bar = Progress(
        TextColumn("ListOps"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), disable=not progress
    )
    with bar:
        task = bar.add_task("generate", total=num_samples)
        while len(out) < num_samples:
            tries += 1
            if tries > limit:
                raise RuntimeError(
                    f"ListOps: only {len(out)} of {num_samples} trees in {limit} tries with min_length={min_length}, "
                    f"max_length={max_length}, max_depth={max_depth}, max_args={max_args}; widen the length bounds"
                )
            item = sample(rng, max_depth, max_args, max_length)
            if item is None or item[2] <= min_length or item[0] in seen:
                continue
            seen.add(item[0])
            out.append((item[0], item[1]))
            bar.advance(task)
    return out


def write_tsv(path: Path, rows: list[tuple[str, int]]) -> None:
    """Python's csv writer with a tab delimiter, exactly as the official generator (CRLF line ends)."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t")
        writer.writerow(["Source", "Target"])
        writer.writerows(rows)


def write_splits(
    out_dir: str | Path,
    num_train: int = 96_000,
    num_val: int = 2_000,
    num_test: int = 2_000,
    task: str = "basic",
    progress: bool = True,
    **knobs: int,
) -> Path:
    """Generate and write `{task}_{train,val,test}.tsv` into `out_dir`; returns `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = generate(num_train + num_val + num_test, progress=progress, **knobs)
    splits = {
        "train": rows[:num_train],
        "val": rows[num_train : num_train + num_val],
        "test": rows[num_train + num_val :],
    }
    for name, split_rows in splits.items():
        tmp = out / f".{task}_{name}.tsv.{os.getpid()}.tmp"  # one per process: concurrent writers never share one
        try:
            write_tsv(tmp, split_rows)
            tmp.replace(out / f"{task}_{name}.tsv")
        finally:
            tmp.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m tasks.generate.listops")
    p.add_argument("--out", required=True, help="output directory (e.g. DATA/listops-1000)")
    p.add_argument("--num-train", type=int, default=96_000)
    p.add_argument("--num-val", type=int, default=2_000)
    p.add_argument("--num-test", type=int, default=2_000)
    p.add_argument("--max-depth", type=int, default=10)
    p.add_argument("--max-args", type=int, default=10)
    p.add_argument("--min-length", type=int, default=500, help="exclusive lower bound on tokens")
    p.add_argument("--max-length", type=int, default=2000, help="exclusive upper bound on tokens")
    p.add_argument("--task", default="basic", help="file prefix: <task>_train.tsv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    try:
        out = write_splits(
            a.out,
            a.num_train,
            a.num_val,
            a.num_test,
            a.task,
            progress=not a.no_progress,
            seed=a.seed,
            max_depth=a.max_depth,
            max_args=a.max_args,
            min_length=a.min_length,
            max_length=a.max_length,
        )
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {a.task}_{{train,val,test}}.tsv to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

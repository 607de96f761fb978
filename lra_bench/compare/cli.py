"""`python -m lra_bench.compare A B [--in DIR...] [--json PATH] [--out PATH.md]` (see the package docstring).

In a terminal the report's main table is drawn (rich); piped or redirected, the report is markdown (`> report.md`).

Exit status: 0 with the report on stdout; 2 with one line on stderr for bad input or an unfair comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from lra_bench.compare.pairing import common_tasks, compare_sides
from lra_bench.compare.report import print_report, render_markdown, to_json
from lra_bench.compare.sides import CompareError, check_comparable, collect
from lra_bench.stats.paired import DEFAULT_RESAMPLES, DEFAULT_SEED

DEFAULT_SEARCH = ("multirun", "outputs")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lra_bench.compare",
        description="Does method A beat method B? Pairs runs by task and seed, reports the accuracy difference with "
        "a confidence interval and a paired test, one verdict per task and for the average, and the efficiency "
        "measured in the same runs. Refuses runs that differ in more than the method and seed.",
    )
    p.add_argument("a", metavar="A", help="run dir, sweep dir, results.json, or a selector such as attn=gpa")
    p.add_argument("b", metavar="B", help="the same for the other side, e.g. attn=nystrom")
    p.add_argument(
        "--in",
        dest="search",
        nargs="+",
        type=Path,
        help=f"dirs a selector searches (default: {', '.join(DEFAULT_SEARCH)} where they exist)",
    )
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="bootstrap/permutation resamples")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of every resampling (deterministic output)")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the verdicts")
    p.add_argument(
        "--allow-differ",
        nargs="+",
        default=[],
        metavar="KEY",
        help="dotted config keys (or prefixes) allowed to differ between A and B besides the method and seed",
    )
    p.add_argument("--include-evaluated", action="store_true", help="also compare eval-only (`evaluated`) runs")
    p.add_argument("--json", type=Path, help="also write the comparison as JSON here")
    p.add_argument("--out", type=Path, help="also write the markdown report here")
    return p


def _check_args(args: argparse.Namespace) -> None:
    if args.resamples < 100:
        raise CompareError(f"--resamples={args.resamples}: use at least 100 (default {DEFAULT_RESAMPLES})")
    if not 0.5 <= args.level < 1.0:
        raise CompareError(f"--level={args.level}: must be in [0.5, 1), e.g. 0.95")
    if not 0.0 < args.alpha < 0.5:
        raise CompareError(f"--alpha={args.alpha}: must be in (0, 0.5), e.g. 0.05")
    missing = [str(d) for d in args.search or () if not d.is_dir()]
    if missing:
        raise CompareError(f"--in: no such directory: {', '.join(missing)}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        _check_args(args)
        search = args.search if args.search is not None else [Path(d) for d in DEFAULT_SEARCH if Path(d).is_dir()]
        a = collect("A", args.a, search, args.include_evaluated)
        b = collect("B", args.b, search, args.include_evaluated)
        shared = {r["_path"] for t in a.runs for r in a.records(t)} & {r["_path"] for t in b.runs for r in b.records(t)}
        if shared:
            raise CompareError(f"A and B share {len(shared)} run(s), e.g. {sorted(shared)[0]}: make the sides disjoint")
        tasks, _, _ = common_tasks(a, b)
        check_comparable(a, b, tasks, args.allow_differ)
        comparison = compare_sides(a, b, level=args.level, n_resamples=args.resamples, seed=args.seed)
    except CompareError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    text = render_markdown(comparison, args.alpha)
    if sys.stdout.isatty():  # a person reads it: the main table drawn; piped or redirected, plain markdown
        print_report(comparison, args.alpha)
    else:
        print(text, end="")
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(to_json(comparison, args.alpha), indent=2, default=str) + "\n")
    return 0

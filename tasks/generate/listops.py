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

Parallel, and independent of the worker count (generator version 2): the candidate trees come in chunks of
`CHUNK_TREES` accepted trees; chunk c draws from its own `random.Random` seeded by numpy's
`SeedSequence(seed, spawn_key=(c,))` (independent streams, the standard way to split one seed). Chunks are
merged in index order, duplicates dropped (first occurrence kept), until `num_samples` trees are in. Every
accepted tree is still an independent draw from the same length-conditioned distribution and the split is the
same prefix rule, so the distribution is version 1's; only which trees a given seed yields changed (version 1
drew everything from one stream). `--workers` only decides how many processes compute chunks: the files are
byte-identical for any worker count.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import multiprocessing as mp
import os
import random
import signal
import sys
import threading
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25  # probability of an operator node below max depth
# What a given seed produces: 1 = one sequential stream (before parallel generation); 2 = chunked streams.
GENERATOR_VERSION = 2
CHUNK_TREES = 256  # accepted trees per chunk; fixed (never derived from the worker count) — part of version 2
MAX_WORKERS = 16  # default worker cap: beyond that the merge in the parent, not the sampling, is the bottleneck


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


@dataclass(frozen=True)
class Knobs:
    """The tree-shape and length knobs one chunk needs (picklable: it crosses into worker processes)."""

    max_depth: int
    max_args: int
    min_length: int
    max_length: int


def chunk_seed(seed: int, index: int) -> int:
    """128-bit seed of chunk `index`: numpy's SeedSequence split of `seed` (independent, reproducible streams)."""
    state = np.random.SeedSequence(seed, spawn_key=(index,)).generate_state(4, dtype=np.uint32)
    return int.from_bytes(state.astype("<u4").tobytes(), "little")


def chunk_try_limit(size: int) -> int:
    """Tries one chunk may spend: an acceptance rate under ~1/10000 means the bounds leave (almost) no trees."""
    return 10_000 * size + 100_000


def generate_chunk(seed: int, index: int, knobs: Knobs, size: int = CHUNK_TREES) -> tuple[list[tuple[str, int]], int]:
    """Chunk `index`: up to `size` accepted (string, label) pairs (duplicates kept: the merge drops them) and
    the number of tries spent. A pure function of its arguments, wherever it runs."""
    rng = random.Random(chunk_seed(seed, index))
    out: list[tuple[str, int]] = []
    tries, limit = 0, chunk_try_limit(size)
    while len(out) < size and tries < limit:
        tries += 1
        item = sample(rng, knobs.max_depth, knobs.max_args, knobs.max_length)
        if item is not None and item[2] > knobs.min_length:
            out.append((item[0], item[1]))
    return out, tries


def default_workers() -> int:
    """The cores this process may use, capped at MAX_WORKERS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def _stop_signals_deferred() -> Iterator[None]:
    """SIGTERM/SIGINT that arrive while the pool's own bookkeeping runs are delivered just after it.

    `run.py`'s handler raises where the signal lands when no training loop is running (there is no step to
    finish). Landing inside `ProcessPoolExecutor.submit`, it can interrupt the start of a worker that the executor
    then never learns of: that worker waits on its queue forever, holding the forkserver and the run's stdout open
    after the run has exited 143 (seen under load). Deferred, the signal lands at the next `result()` or in the
    consumer instead, where unwinding shuts the pool down cleanly. (A signal mask would not do: Python runs its
    handlers in the main thread whichever thread the kernel picked.) Handlers can only be swapped in the main
    thread; elsewhere no handler of ours raises, and nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, _frame: arrived.append(signum)) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for number in arrived:
            signal.raise_signal(number)  # to the handler that was in place, exactly as if it arrived now


def _chunks_in_order(seed: int, knobs: Knobs, workers: int) -> Generator[tuple[list[tuple[str, int]], int], None, None]:
    """Chunk results for index 0, 1, 2, … in order; `workers` processes compute ahead of the consumer.

    A `forkserver` pool: no fork of a possibly multi-threaded caller (a training process), and the workers
    import only this module. At most 2 chunks per worker are in flight, so stopping early wastes little.
    """
    if workers <= 1:
        index = 0
        while True:
            yield generate_chunk(seed, index, knobs)
            index += 1
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("forkserver"))  # starts no process
    pending: deque[Future] = deque()
    index = 0
    try:
        while True:
            with _stop_signals_deferred():
                while len(pending) < 2 * workers:
                    pending.append(pool.submit(generate_chunk, seed, index, knobs))
                    index += 1
            yield pending.popleft().result()
    finally:
        with _stop_signals_deferred():  # the chunks in flight finish (short); the rest are cancelled
            pool.shutdown(wait=True, cancel_futures=True)


def generate(
    num_samples: int,
    seed: int = 0,
    max_depth: int = 10,
    max_args: int = 10,
    min_length: int = 500,
    max_length: int = 2000,
    progress: bool = True,
    max_tries: int | None = None,
    workers: int | None = None,
) -> list[tuple[str, int]]:
    """`num_samples` distinct (string, label) pairs with `min_length < length < max_length`.

    `workers` processes (default: all cores, capped at MAX_WORKERS) compute the chunks; the result does not
    depend on it (see the module docstring)."""
    if not 0 <= min_length < max_length - 1:
        raise ValueError(f"need 0 <= min_length < max_length - 1, got min_length={min_length}, max_length={max_length}")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers={workers}: need at least 1 process")
    knobs = Knobs(max_depth, max_args, min_length, max_length)
    limit = max_tries or 10_000 * max(num_samples, 1) + 100_000
    needed_chunks = -(-num_samples // CHUNK_TREES)
    workers = min(workers, max(needed_chunks, 1))  # no idle processes for a small request
    seen: set[str] = set()
    out: list[tuple[str, int]] = []
    tries = 0
    bar = Progress(
        TextColumn("ListOps"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), disable=not progress
    )
    chunks = _chunks_in_order(seed, knobs, workers)  # the pool starts before rich's refresh thread
    try:
        with bar:
            task = bar.add_task("generate", total=num_samples)
            while len(out) < num_samples:
                rows, spent = next(chunks)
                tries += spent
                if len(rows) < CHUNK_TREES or tries > limit:  # a chunk that ran out of tries: hopeless bounds
                    raise RuntimeError(
                        f"ListOps: only {len(out)} of {num_samples} trees in {tries} tries with "
                        f"min_length={min_length}, max_length={max_length}, max_depth={max_depth}, "
                        f"max_args={max_args}; widen the length bounds"
                    )
                before = len(out)
                for text, label in rows:
                    if text in seen:
                        continue
                    seen.add(text)
                    out.append((text, label))
                    if len(out) == num_samples:
                        break
                bar.advance(task, len(out) - before)
    finally:
        chunks.close()
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
    workers: int | None = None,
    **knobs: int,
) -> Path:
    """Generate and write `{task}_{train,val,test}.tsv` into `out_dir`; returns `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = generate(num_train + num_val + num_test, progress=progress, workers=workers, **knobs)
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
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"processes (default: all cores, at most {MAX_WORKERS}); the files do not depend on it",
    )
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
            workers=a.workers,
            seed=a.seed,
            max_depth=a.max_depth,
            max_args=a.max_args,
            min_length=a.min_length,
            max_length=a.max_length,
        )
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the files are written only once every tree is in: none is partial
        print(f"stopped: no file was written to {a.out}; the same command generates from the start", file=sys.stderr)
        return 130
    print(f"wrote {a.task}_{{train,val,test}}.tsv to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

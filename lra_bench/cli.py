"""`lra-bench COMMAND [ARGS ...]`: the console entry point beside the `python -m` forms, one command per app.

Each command runs its app exactly as `python -m <module>` does (`runpy`, `__main__`, the same arguments), so
`lra-bench compare A B` and `python -m lra_bench.compare A B` are one program; `train` runs `run.py` (the Hydra app
whose job name names `run.log`), found beside the package in a checkout or an editable install.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

#: command → (module run as `__main__`, or None for run.py; what it does)
COMMANDS: dict[str, tuple[str | None, str]] = {
    "train": (None, "one run, or a sweep with -m (Hydra overrides: lra-bench train task=listops attn=gpa)"),
    "eval": ("lra_bench.evaluate", "test one checkpoint with the model it was trained as"),
    "compare": ("lra_bench.compare", "does X beat Y: paired statistics over seeds and examples"),
    "leaderboard": ("lra_bench.leaderboard", "tables across runs, beside the published numbers"),
    "runs": ("lra_bench.runs", "list the runs under an output dir: status, task, attention, accuracy, path"),
    "bench": ("lra_bench.bench", "attention speed and memory against sequence length"),
}
RUN_PY = Path(__file__).resolve().parents[1] / "run.py"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: lra-bench COMMAND [ARGS ...]   (COMMAND --help for its own options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"error: lra-bench {command}: no such command; expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, _ = COMMANDS[command]
    if module is None:
        if not RUN_PY.is_file():
            print(
                f"error: lra-bench train: {RUN_PY} not found — training runs from a checkout of the repository "
                "(pip install -e <checkout>, or make install)",
                file=sys.stderr,
            )
            return 2
        sys.argv = [str(RUN_PY), *rest]  # as `python run.py …` (Lightning's DDP launcher re-runs sys.argv)
        runpy.run_path(str(RUN_PY), run_name="__main__")
        return 0
    if importlib.util.find_spec(module) is None:
        print(f"error: lra-bench {command}: {module} is not part of this installation of lra-bench", file=sys.stderr)
        return 2
    sys.argv = [module, *rest]  # run_module sets argv[0] to the module's file, as `python -m` does
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m lra_bench.fidelity [--check]`: write docs/fidelity.md from the fidelity YAMLs (or check it is current)."""

from __future__ import annotations

import sys
from pathlib import Path

from lra_bench.fidelity.table import render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is not the rendering of lra_bench/fidelity/*.yaml: run python -m lra_bench.fidelity")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

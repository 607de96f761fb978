"""`python -m models.kernels`: build every compiled kernel now (what `make install` runs), so the first run does not
wait for the compiler; prints where each one lives, or the line saying why it could not be built."""

from __future__ import annotations

from models.kernels import SOURCES, load

if __name__ == "__main__":
    for source in sorted(SOURCES.glob("*.cpp")):
        module = load(source.stem)
        if module is not None:
            print(f"[lra-bench] kernel {source.stem}: {module.__file__}")

"""Writing files safely, shared by every part that writes (the data cache, the generators, checkpoints, the result
record): a temp file unique to the writing process, renamed into place when complete and removed on any failure,
with the permissions the user's umask asks for.

Why not `tempfile.mkstemp` alone: it creates mode 0600, and a rename keeps the mode — `results.json` came out
unreadable to the group on shared clusters whose leaderboards read other people's runs. `tempfile.mkdtemp` (the
cache) is 0700 for the same reason. Lives in `tasks` because that is the bottom layer (`lra_bench` imports it; `tasks`
never imports `lra_bench`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

_UMASK: int | None = None


def umask() -> int:
    """This process's umask, read without changing it (`os.umask` can only be read by setting it, which would race
    with files other threads create meanwhile)."""
    global _UMASK
    if _UMASK is None:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("Umask:"):
                    _UMASK = int(line.split()[1], 8)
                    break
        except OSError:
            pass
        if _UMASK is None:  # no /proc (macOS): read it the racy way, once, at first use
            _UMASK = os.umask(0o022)
            os.umask(_UMASK)
    return _UMASK


def make_readable(path: str | Path) -> None:
    """Give `path` the mode a plain `open()`/`mkdir()` would have given it (0666/0777 minus the umask)."""
    base = 0o777 if Path(path).is_dir() else 0o666
    os.chmod(path, base & ~umask())


def unique_tmp(path: str | Path) -> Path:
    """A hidden temp name beside `path`, unique to this process and call (`.name.<pid>.<random>.tmp`)."""
    path = Path(path)
    return path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path to write `path`'s new content to; on success it gets the umask's mode and is renamed over
    `path` (readers see the old file or the new one, never half of one); on any failure it is removed."""
    path = Path(path)
    tmp = unique_tmp(path)
    try:
        yield tmp
        make_readable(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


_DIGESTS: dict[tuple[str, int, int], str] = {}


def content_digest(paths: list[Path]) -> str:
    """sha256 over the bytes of `paths` in order (16 hex digits): what the files hold, wherever they lie and whatever
    their mtimes. Cached per (path, size, mtime) for the process, since a record asks once per stage."""
    whole = hashlib.sha256()
    for path in paths:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in _DIGESTS:
            one = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    one.update(block)
            _DIGESTS[key] = one.hexdigest()
        whole.update(_DIGESTS[key].encode())
    return whole.hexdigest()[:16]

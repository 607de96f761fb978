"""A real `run.py` in a real pseudo-terminal (160 columns), for the tests about what a person sees on screen."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from tests.conftest import REPO


def read_pty(fd: int, proc: subprocess.Popen, timeout: float) -> str:
    """Everything the process writes to the terminal until it closes it, exits, or `timeout` s pass."""
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the other side closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    return b"".join(chunks).decode(errors="replace")


def run_in_terminal(args: list[str], tmp_path: Path, wandb_mode: str = "offline") -> tuple[int, str]:
    """`run.py args` (outputs and data under `tmp_path`) with a pty as stdin/stdout/stderr: (exit code, screen)."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = {**os.environ, "WANDB_MODE": wandb_mode, "OMP_NUM_THREADS": "1", "COLUMNS": "160", "TERM": "xterm"}
    cmd = [sys.executable, str(REPO / "run.py"), *args]
    cmd += [f"output_root={tmp_path / 'outputs'}", f"data_dir={tmp_path / 'data'}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=secondary, stdout=secondary, stderr=secondary)
    os.close(secondary)
    try:
        screen = read_pty(primary, proc, timeout=400)
        proc.wait(timeout=60)
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, screen

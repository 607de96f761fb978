"""A real `run.py` in a real pseudo-terminal (160 columns), for the tests about what a person sees on screen."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
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


def _controlling_terminal() -> None:
    """In the child: a session of its own with the pty as its controlling terminal, Ctrl-C's default action (a
    pytest started in the background hands SIGINT down ignored), so the terminal's ^C reaches it as SIGINT."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_in_terminal(args: list[str], tmp_path: Path, wandb_mode: str = "offline") -> tuple[subprocess.Popen, int]:
    """`run.py args` (outputs and data under `tmp_path`) in a pty of 160 columns that is its controlling terminal:
    the process and the pty's other end (`type_ctrl_c` on it is a real Ctrl-C)."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = {**os.environ, "WANDB_MODE": wandb_mode, "OMP_NUM_THREADS": "1", "COLUMNS": "160", "TERM": "xterm"}
    cmd = [sys.executable, str(REPO / "run.py"), *args]
    cmd += [f"output_root={tmp_path / 'outputs'}", f"data_dir={tmp_path / 'data'}"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdin=secondary, stdout=secondary, stderr=secondary, preexec_fn=_controlling_terminal
    )
    os.close(secondary)
    return proc, primary


def type_ctrl_c(fd: int) -> None:
    """Ctrl-C typed at the terminal: its line discipline sends SIGINT to the foreground process group."""
    os.write(fd, b"\x03")


def read_until(fd: int, proc: subprocess.Popen, text: str, timeout: float) -> str:
    """What the process writes to the terminal until `text` appears in it (fails when it exits first or in time)."""
    chunks, deadline = [], time.monotonic() + timeout
    while text not in b"".join(chunks).decode(errors="replace"):
        assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f} s:\n{b''.join(chunks)[-3000:]!r}"
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            assert data, f"the terminal closed before {text!r}:\n{b''.join(chunks)[-3000:]!r}"
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def run_in_terminal(args: list[str], tmp_path: Path, wandb_mode: str = "offline") -> tuple[int, str]:
    """`run.py args` (outputs and data under `tmp_path`) with a pty as stdin/stdout/stderr: (exit code, screen)."""
    proc, primary = start_in_terminal(args, tmp_path, wandb_mode)
    try:
        screen = read_pty(primary, proc, timeout=400)
        proc.wait(timeout=60)
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, screen

"""A real single-node SLURM cluster for tests: munged + slurmctld + slurmd, all under one temp dir.

Why: the submitit launcher and our requeue/resume logic only prove themselves against a real scheduler
(DESIGN §6). Debian's `slurm-wlm` and `munge` start in seconds as root, without systemd, when every
path (key, socket, state, spool, logs, pids) lives in a private temp dir and the ports are picked free.

Usage::

    with LocalSlurm() as cluster:
        job = cluster.submit(wrap="echo hi > out.txt")
        assert cluster.wait(job, timeout=60) == "COMPLETED"

`start()` raises SlurmUnavailable when SLURM cannot be installed here (not root, no apt, apt failed: tests
skip) and SlurmStartError, with the daemon logs, when it is installed but does not come up (tests fail).
There is no accounting daemon: job states come from `scontrol show job` (kept for MinJobAge=3600 s), and
`sacct` answers "Slurm accounting storage is disabled".

The daemons run in the foreground (`-D` / `-F`) as our own children, so their pids are exact and an early
exit is seen at once with its log tail. Teardown cancels the jobs, then stops exactly those pids
(SIGTERM, then SIGKILL) and deletes only the temp dir it made.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "squeue", "scontrol", "sinfo", "scancel", "munge", "unmunge")
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
    }
)
APT_PACKAGES = ("slurm-wlm", "munge")


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be installed here (not root, no apt, apt failed): tests skip with this message."""


class SlurmStartError(RuntimeError):
    """SLURM is installed but a daemon failed or the node never came up: a real failure, with the logs."""


def _missing_binaries() -> list[str]:
    return [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]


def ensure_installed(timeout_s: float = 900.0) -> None:
    """Install `slurm-wlm` and `munge` with apt-get when a binary is missing and we are root.

    Installing is allowed (the Debian registry is reachable in CI) but must never hang a test run, hence
    the timeouts and `DEBIAN_FRONTEND=noninteractive`. In a container without systemd, postinst's
    `invoke-rc.d` is refused by policy-rc.d, so no system daemon is left running.
    """
    missing = _missing_binaries()
    if not missing:
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"missing {missing} and not root: cannot apt-get install {list(APT_PACKAGES)}")
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"missing {missing} and no apt-get on PATH")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + timeout_s
    lock = ["-o", "DPkg::Lock::Timeout=120"]  # wait for a concurrent apt/dpkg instead of failing at once
    for cmd in (["apt-get", *lock, "update", "-q"], ["apt-get", *lock, "install", "-y", "-q", *APT_PACKAGES]):
        left = max(1.0, deadline - time.monotonic())
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailable(f"{' '.join(cmd)} timed out after {left:.0f}s") from exc
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise SlurmUnavailable(f"{' '.join(cmd)} failed (rc={proc.returncode}):\n{tail}")
    still = _missing_binaries()
    if still:
        raise SlurmUnavailable(f"apt-get install {list(APT_PACKAGES)} finished but {still} are still missing")


def _short_hostname() -> str:
    """`hostname -s`: slurmctld only runs where its own short name equals SlurmctldHost."""
    try:
        out = subprocess.run(["hostname", "-s"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out or socket.gethostname().split(".")[0]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _node_hardware() -> dict[str, int]:
    """The node line fields as slurmd itself detects them, so the node never drains on a mismatch."""
    hw: dict[str, int] = {"CPUs": os.cpu_count() or 1}
    try:
        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=20).stdout
        for key, val in re.findall(r"(\w+)=(\d+)", out.splitlines()[0] if out else ""):
            if key in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory"):
                hw[key] = int(val)
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    if "RealMemory" not in hw:
        hw["RealMemory"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    # A bit under the real memory: slurmd drains a node that reports less than RealMemory.
    hw["RealMemory"] = max(256, int(hw["RealMemory"] * 0.9))
    return hw


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


class LocalSlurm:
    """One munged, one slurmctld and one slurmd on this host, configured and owned by this object.

    Attributes after `start()`: `root` (the temp dir), `conf` (slurm.conf path), `env` (os.environ plus
    SLURM_CONF: pass it to every subprocess that calls sbatch/squeue/scontrol), `hostname`,
    `startup_s` (seconds from start() to the node being idle), `jobs_dir` (default cwd and output dir
    of submitted jobs), `pids` (daemon name -> pid), `node_cpus`.
    Partitions: `debug` (default, preemptable: requeue after GraceTime) and the hidden `urgent`, whose
    jobs preempt `debug` jobs, for tests of the preemption path.
    """

    def __init__(
        self,
        root: Path | None = None,
        start_timeout_s: float = 60.0,
        install: bool = True,
        cluster_name: str = "lratest",
        requeue_delay_s: int = 5,
        grace_time_s: int = 5,
    ) -> None:
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="lraslurm-"))
        self.start_timeout_s = start_timeout_s
        self.install = install
        self.cluster_name = cluster_name
        self.requeue_delay_s = requeue_delay_s
        self.grace_time_s = grace_time_s
        self.hostname = _short_hostname()
        self.conf = self.root / "slurm.conf"
        self.jobs_dir = self.root / "jobs"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.env: dict[str, str] = dict(os.environ)
        self.pids: dict[str, int] = {}
        self.startup_s: float | None = None
        self.node_cpus: int = os.cpu_count() or 1
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LocalSlurm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalSlurm:
        """Install if needed, write key and config, start the three daemons, wait until the node is idle."""
        t0 = time.monotonic()
        try:
            if self.install:
                ensure_installed()
            elif _missing_binaries():
                raise SlurmUnavailable(f"missing binaries {_missing_binaries()} (install=False)")
            if os.geteuid() != 0:
                raise SlurmUnavailable("LocalSlurm runs slurmd as root (SlurmUser=root); not root here")
            self._prepare_dirs()
            self._write_munge_key()
            self._start_munged()
            self._write_conf()
            self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
            for var in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_ARRAY_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS"):
                self.env.pop(var, None)  # we may be running inside another job's allocation
            self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
            self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.hostname])
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Cancel our jobs, then stop exactly the daemons we started (SIGTERM, then SIGKILL)."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            self._cancel_all_jobs(timeout_s=15.0)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.pids.clear()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ client helpers
    def run(self, *args: str, timeout_s: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command against this cluster (SLURM_CONF set)."""
        proc = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout_s, cwd=self.jobs_dir
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed (rc={proc.returncode}): {proc.stderr.strip()}")
        return proc

    def submit(self, script: str | Path | None = None, *, wrap: str | None = None, args: Sequence[str] = ()) -> int:
        """Submit a batch job and return its id.

        `script` is a path to a script, or the text of one (starting with `#!`); or pass `wrap=` for
        `sbatch --wrap`. sbatch runs in `jobs_dir`, so jobs default to that working dir and write
        `slurm-<id>.out` there; `#SBATCH` lines and `args` override that as usual.
        """
        cmd = ["sbatch", "--parsable", *args]
        if wrap is not None:
            cmd += ["--wrap", wrap]
        elif isinstance(script, Path) or (isinstance(script, str) and not script.startswith("#!")):
            cmd.append(str(script))
        elif isinstance(script, str):
            fd, path = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.jobs_dir)
            with os.fdopen(fd, "w") as fh:
                fh.write(script)
            cmd.append(path)
        else:
            raise ValueError("submit() needs script= (path or '#!' text) or wrap=")
        out = self.run(*cmd).stdout.strip()
        return int(out.split(";")[0])

    def job_info(self, job_id: int | str) -> list[dict[str, str]]:
        """`scontrol show job -o` records for a job (several for an array); [] when SLURM forgot it."""
        proc = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if proc.returncode != 0:
            return []
        return [dict(re.findall(r"(\w[\w:/]*)=(\S*)", line)) for line in proc.stdout.splitlines() if line]

    def state(self, job_id: int | str) -> str:
        """The JobState (e.g. PENDING, RUNNING, COMPLETED); states of array tasks joined by ','."""
        states = list(dict.fromkeys(rec.get("JobState", "UNKNOWN") for rec in self.job_info(job_id)))
        return ",".join(states) if states else "UNKNOWN"

    def wait(self, job_id: int | str, timeout: float = 120.0, poll_s: float = 0.5) -> str:
        """Block until every record of the job is in a terminal state; return `state()`.

        Raises TimeoutError with the job record and the daemon log tails (so a CI failure says why).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            recs = self.job_info(job_id)
            if recs and all(rec.get("JobState") in TERMINAL_STATES for rec in recs):
                return self.state(job_id)
            time.sleep(poll_s)
        raise TimeoutError(f"job {job_id} not finished after {timeout}s: {self.job_info(job_id)}\n{self.logs()}")

    def wait_state(self, job_id: int | str, states: Sequence[str], timeout: float = 60.0) -> str:
        """Block until the job is in one of `states` (e.g. RUNNING), for tests that act mid-run."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            current = self.state(job_id)
            if current in states:
                return current
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} never reached {list(states)} in {timeout}s (now {self.state(job_id)})")

    def requeue(self, job_id: int | str) -> None:
        """`scontrol requeue`: the job is killed and put back in the queue with SLURM_RESTART_COUNT+1."""
        self.run("scontrol", "requeue", str(job_id))

    def cancel(self, job_id: int | str, signal_name: str | None = None) -> None:
        """`scancel`, or deliver a signal (e.g. USR2, as submitit's preemption path expects) to the batch step."""
        extra = ["--signal", signal_name, "--batch"] if signal_name else []
        self.run("scancel", *extra, str(job_id))

    def logs(self) -> str:
        """Tails of the daemon logs, for error messages."""
        return "\n".join(f"--- {name} ---\n{_tail(self.root / 'log' / f'{name}.log', 1500)}" for name in DAEMONS)

    # ------------------------------------------------------------------ internals
    def _prepare_dirs(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # munged refuses keys/sockets in dirs writable by others
        for sub in ("munge", "state", "spool", "log", "run", "jobs"):
            (self.root / sub).mkdir(exist_ok=True, mode=0o700)
        os.chmod(self.jobs_dir, 0o755)

    def _write_munge_key(self) -> None:
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(1024))

    def _start_munged(self) -> None:
        mdir = self.root / "munge"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={mdir / 'munge.key'}",
                f"--pid-file={mdir / 'munged.pid'}",
                f"--seed-file={mdir / 'munged.seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                "--num-threads=2",
            ],
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            self._check_alive()
            if self.munge_socket.exists():
                cred = subprocess.run(["munge", "-n", "-S", str(self.munge_socket)], capture_output=True, timeout=10)
                if cred.returncode == 0:
                    check = subprocess.run(
                        ["unmunge", "-S", str(self.munge_socket)],
                        input=cred.stdout,
                        capture_output=True,
                        timeout=10,
                    )
                    if check.returncode == 0:
                        return
            time.sleep(0.1)
        raise SlurmStartError(f"munged did not answer on {self.munge_socket} in 15s\n{self.logs()}")

    def _write_conf(self) -> None:
        hw = _node_hardware()
        self.node_cpus = hw["CPUs"]
        node = " ".join(f"{k}={v}" for k, v in hw.items())
        def_mem = max(128, min(1024, hw["RealMemory"] // max(1, hw["CPUs"])))
        r, h = self.root, self.hostname
        lines = [
            "# generated by tests/slurm_cluster.py — a throwaway single-node cluster",
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={h}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
            f"AuthInfo=socket={self.munge_socket},cred_expire={self.requeue_delay_s}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups, no accounting daemon: works in a container without systemd.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            f"DefMemPerCPU={def_mem}",
            "SchedulerType=sched/backfill",
            # Requeue (scontrol requeue, submitit's checkpoint()) and quick, visible job ends for tests.
            "JobRequeue=1",
            "ReturnToService=2",
            "MinJobAge=3600",
            "KillWait=5",
            "InactiveLimit=0",
            "MessageTimeout=10",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            # Preemption by partition priority, requeueing the victim and sending it its --signal first
            # (SlurmctldParameters=preempt_send_user_signal), as a real cluster's preemption would.
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            "SlurmctldParameters=preempt_send_user_signal",
            # Fast scheduling passes: a requeued job is started by a periodic pass, not by an event.
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            # No RebootProgram: nodes are never rebooted.
            f"NodeName={h} NodeAddr=127.0.0.1 {node} State=UNKNOWN",
            f"PartitionName=debug Nodes={h} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
            f"PreemptMode=REQUEUE GraceTime={self.grace_time_s}",
            f"PartitionName=urgent Nodes={h} Default=NO MaxTime=INFINITE State=UP PriorityTier=10 "
            "PreemptMode=OFF Hidden=YES",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.root / "log" / f"{name}.stdout", "wb") as out:  # the child keeps its own copy
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "SLURM_CONF": str(self.conf)},
                start_new_session=True,  # a Ctrl-C in the test terminal reaches us, not the daemons
            )
        self._procs[name] = proc
        self.pids[name] = proc.pid

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                stdout = _tail(self.root / "log" / f"{name}.stdout")
                raise SlurmStartError(
                    f"{name} exited with rc={proc.returncode} during start-up\nstdout/stderr:\n{stdout}\n{self.logs()}"
                )

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            proc = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env, capture_output=True, text=True, timeout=15
            )
            last = (proc.stdout + proc.stderr).strip()
            if proc.returncode == 0 and any(
                line.split()[1:2] == ["idle"] for line in proc.stdout.splitlines() if line.strip()
            ):
                return
            time.sleep(0.2)
        raise SlurmStartError(f"node not idle within {self.start_timeout_s}s (sinfo: {last!r})\n{self.logs()}")

    def _cancel_all_jobs(self, timeout_s: float) -> None:
        try:
            ids = self.run("squeue", "-h", "-o", "%A", check=False, timeout_s=10).stdout.split()
            if ids:
                self.run("scancel", *ids, check=False, timeout_s=10)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if not self.run("squeue", "-h", "-o", "%A", check=False, timeout_s=10).stdout.split():
                    return
                time.sleep(0.2)
        except (OSError, subprocess.SubprocessError):
            pass

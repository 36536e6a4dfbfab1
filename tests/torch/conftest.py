"""torchrun runs of scripts for the PyTorch tests, and a `inagg switch serve` process for them.

Every wait here is bounded: a run past its time is killed with every process it started, and the test
fails with what the ranks and the service wrote. Output goes to files, never to a pipe: a pipe nobody
reads while the ranks run fills and stops them, and a read of it has no deadline.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from inagg.models.switch import ModelSwitch

ROOT = Path(__file__).resolve().parents[2]
# How often a bounded wait looks at a file or a process again.
POLL = 0.05


class Process:
    """A command in a session of its own (so that it is killed with every process it started), its standard
    output and error in files under ``folder``."""

    def __init__(self, cmd: list[str], folder: Path, name: str, env: dict | None = None):
        self.name = name
        self.out_path, self.err_path = folder / f"{name}.out", folder / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=ROOT,
                                          start_new_session=True,
                                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def report(self) -> str:
        """Everything the process wrote, for a failing test's message."""
        return f"--- {self.name} stdout ---\n{self.out}\n--- {self.name} stderr ---\n{self.err}"

    def wait_for(self, pattern: str, count: int, timeout: float, *, where: str = "out") -> list[re.Match]:
        """The first ``count`` matches of ``pattern`` in the output (``where``: "out" or "err") that differ in
        their first group; fails the test when the process ends first or ``timeout`` seconds pass."""
        end = time.monotonic() + timeout
        while True:
            found = {}
            for m in re.finditer(pattern, getattr(self, where)):
                found.setdefault(m.group(1), m)
            if len(found) >= count:
                return list(found.values())[:count]
            if self.popen.poll() is not None:
                self.kill()
                pytest.fail(f"{self.name} ended (status {self.popen.returncode}) before {count} of {pattern!r}:\n"
                            f"{self.report()}")
            if time.monotonic() > end:
                self.kill()
                pytest.fail(f"no {count} of {pattern!r} from {self.name} within {timeout} s:\n{self.report()}")
            time.sleep(POLL)

    def finish(self, timeout: float) -> int:
        """The exit status; fails the test (and kills the session) when the process runs past ``timeout`` s."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.name} did not finish within {timeout} s:\n{self.report()}")

    def kill(self) -> None:
        """SIGKILL to the whole session, if the process still runs."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)

    def stop(self) -> None:
        """SIGTERM to the whole session (the service then logs its counters), SIGKILL after 10 s."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


@pytest.fixture
def unused_address():
    """``address()``: ``"127.0.0.1:PORT"`` with a TCP port that nothing listens on (for a process group's
    rendezvous, or a switch address that refuses)."""
    def address() -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return "127.0.0.1:%d" % s.getsockname()[1]
    return address


@pytest.fixture
def processes(tmp_path):
    """``start(cmd, name, env=None)``: a :class:`Process`; every one still running is killed at the end, and
    what each wrote is printed (pytest shows it when the test fails)."""
    started: list[Process] = []

    def start(cmd: list[str], name: str, env: dict | None = None) -> Process:
        started.append(Process(cmd, tmp_path, f"{name}{len(started)}", env))
        return started[-1]

    yield start
    for p in started:
        p.stop()
        print(p.report())


@pytest.fixture
def torchrun_process(processes):
    """``start(script, nproc, *args, env=None)``: a :class:`Process` running torchrun of ``script`` (relative
    to the repository) on ``nproc`` CPU processes of this machine."""
    def start(script: str, nproc: int, *args: str, env=None) -> Process:
        return processes([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                          "--standalone", str(ROOT / script), *args], "torchrun", env)
    return start


@pytest.fixture
def torchrun(torchrun_process):
    """``run(script, nproc, *args, env=None, timeout=300)``: torchrun ``script`` on ``nproc`` CPU processes;
    returns ``(returncode, stdout, stderr)``, and fails the test, with the ranks' output, past ``timeout`` s."""
    def run(script: str, nproc: int, *args: str, env=None, timeout: float = 300) -> tuple[int, str, str]:
        p = torchrun_process(script, nproc, *args, env=env)
        rc = p.finish(timeout)
        return rc, p.out, p.err
    return run


@pytest.fixture
def served_switch(processes):
    """``start(*options)``: `inagg switch serve` on loopback with ``options``; returns ``(process, "HOST:PORT")``,
    ``process`` a :class:`Process` whose ``err`` is the service's log. It is killed at the end of the test."""
    def start(*options: str) -> tuple[Process, str]:
        serve = processes([sys.executable, "-m", "inagg.cli", "switch", "serve", "--listen", "127.0.0.1:0",
                           "--vxlan", "127.0.0.1:0", *options], "serve")
        # The fast switch compiles before the service listens: tens of seconds with a cold numba cache.
        (m,) = serve.wait_for(r"listening: control ([\d.]+:\d+)", 1, 180, where="err")
        return serve, m.group(1)
    return start


class PromotingSwitch(ModelSwitch):
    """Emits every result as FP32, as the switch does when a lane of the chunk overflowed."""

    def _lanes_out(self, lanes):
        payload, fp32, saturated = super()._lanes_out(lanes)
        if not fp32:
            payload, fp32 = np.frombuffer(payload, ">i4").astype(np.float32).astype(">f4").tobytes(), True
        return payload, fp32, saturated


@pytest.fixture
def promoting_switch():
    """A model switch class whose results are all FP32 (``PromotingSwitch(spec)``)."""
    return PromotingSwitch


class SilentSwitch(ModelSwitch):
    """Takes every frame and answers none, as a switch that lost its state would."""

    def receive(self, port, frame):
        return []


@pytest.fixture
def silent_switch():
    """A model switch class that never answers (``SilentSwitch(spec)``)."""
    return SilentSwitch

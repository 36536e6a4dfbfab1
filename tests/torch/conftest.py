"""torchrun runs of scripts for the PyTorch tests, and a `inagg switch serve` process for them."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inagg.models.switch import ModelSwitch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def torchrun():
    """``run(script, nproc, *args, env=None, timeout=180)``: torchrun ``script`` (relative to the repository) on
    ``nproc`` CPU processes; returns ``(returncode, stdout, stderr)``, and fails the test past ``timeout`` seconds."""
    def run(script: str, nproc: int, *args: str, env=None, timeout: float = 180) -> tuple[int, str, str]:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
               str(ROOT / script), *args]
        # A session of its own, so that a run past its time is killed with every rank it started.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            pytest.fail(f"torchrun did not finish within {timeout} s:\n{out}{err}")
        return p.returncode, out, err
    return run


@pytest.fixture
def served_switch():
    """``start(*options)``: `inagg switch serve` on loopback with ``options``; returns ``(process, "HOST:PORT")``.
    Every service started is stopped (SIGKILL) at the end of the test."""
    procs = []

    def start(*options: str) -> tuple[subprocess.Popen, str]:
        serve = subprocess.Popen([sys.executable, "-m", "inagg.cli", "switch", "serve", "--listen", "127.0.0.1:0",
                                  "--vxlan", "127.0.0.1:0", *options], stderr=subprocess.PIPE, text=True)
        procs.append(serve)
        line = serve.stderr.readline()
        return serve, line.split("listening: control ")[1].split(",")[0]

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(30)


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

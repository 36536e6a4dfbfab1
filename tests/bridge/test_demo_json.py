"""``inagg demo --switch rtl --json`` writes only its JSON document to standard output, even on a cold build."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inagg.testbench.sim import BUILD_ROOT_ENV

pytestmark = [pytest.mark.cocotb, pytest.mark.slow]


def test_a_cold_rtl_build_prints_its_log_to_stderr_and_only_json_to_stdout(tmp_path):
    # An empty build folder: Verilator, the compiler and the simulator all run, as on a first demo.
    exe = Path(sys.executable).with_name("inagg")
    out = subprocess.run([str(exe), "demo", "--switch", "rtl", "--width", "64", "--workers", "2", "--size", "4KiB",
                          "--json"], capture_output=True, text=True, env={**os.environ, BUILD_ROOT_ENV: str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert summary["ok"] and summary["rtl"]["width"] == 64
    assert any(tmp_path.iterdir()), "the build did not land in the folder given"
    assert "verilator" in out.stderr.lower()  # the build's log is there, not lost


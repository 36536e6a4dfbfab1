"""The exception engine as Verilated Verilog under cocotb: seeded random streams against the model.

One Verilator build, with the switch's default exception path (256 entries
per table, 16 kicks, 4 stash entries); the streams fill the table past
saturation and drain it again, with and without idle cycles and
backpressure. Corner cases and other parameters run in
``tests/hdl/test_exception.py``.
"""

import pytest

from inagg.hdl.exception import ExceptionEngine
from inagg.models.job import ExceptionSpec
from inagg.testbench.exception.sim import Build

pytestmark = pytest.mark.cocotb


@pytest.fixture(autouse=True)
def one_build_job(monkeypatch):
    # The runner compiles with one make job per core; the machines these run on are shared.
    monkeypatch.setattr("cocotb_tools.runner.MAX_PARALLEL_BUILD_JOBS", 1)


def test_exception_engine_random_streams(tmp_path):
    spec = ExceptionSpec()
    Build(ExceptionEngine(spec.table, spec.max_kicks, spec.stash), tmp_path).test(
        requests=10_000, seed=4, jobs=32, slots=64)

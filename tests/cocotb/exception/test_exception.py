"""The exception engine as Verilated Verilog under cocotb: seeded random streams against the model.

One Verilator build, with the switch's default exception path (256 entries
per table, 16 kicks, 4 stash entries); the streams (``cocotb_engine.py``)
fill the table past saturation and drain it again, with and without idle
cycles and backpressure. Corner cases and other parameters run in
``tests/hdl/test_exception.py``.
"""

from pathlib import Path

import pytest

from inagg.hdl.exception import ExceptionEngine
from inagg.models.job import ExceptionSpec
from inagg.testbench import sim

pytestmark = pytest.mark.cocotb


def test_exception_engine_random_streams():
    spec = ExceptionSpec()
    params = dict(table=spec.table, max_kicks=spec.max_kicks, stash=spec.stash)
    sim.build("exception_engine", params, ExceptionEngine, toplevel="exception_engine").run(
        "cocotb_engine", module_dir=Path(__file__).parent, stimulus=dict(requests=10_000, seed=4, jobs=32, slots=64))

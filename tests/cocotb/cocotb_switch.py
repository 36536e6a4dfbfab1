"""cocotb tests of the switch top against the model switch (run by test_switch.py)."""

from __future__ import annotations

import json
import os

import cocotb
import numpy as np

from inagg.models.job import SwitchSpec
from inagg.testbench.switch_tb import SwitchTB
from inagg.testbench.traffic import contribution, lanes, make_job

PARAMS = json.loads(os.environ.get("INAGG_PARAMS", "{}"))


def _spec() -> SwitchSpec:
    return SwitchSpec(ports=PARAMS["ports"], slots=PARAMS["slots"], chunk_bytes=PARAMS["chunk_bytes"])


async def _tb(dut) -> SwitchTB:
    tb = SwitchTB(dut, _spec())
    await tb.reset()
    return tb


@cocotb.test()
async def one_chunk(dut):
    """One job, three workers, one chunk: the results match the model byte for byte."""
    tb = await _tb(dut)
    spec = tb.spec
    job = make_job(spec, 1, 3, 0, 4)
    await tb.configure([job])
    rng = np.random.default_rng(1)
    for w in range(3):
        await tb.send(job.workers[w].port, contribution(spec, job, w, 0, lanes(rng, spec)))
    out = await tb.check()
    assert sum(len(v) for v in out.values()) == 3

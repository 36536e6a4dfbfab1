"""cocotb test of the switch top with its management bridge (run by test_switch.py on its management builds).

The host side is the host library's own, as on a board: ``Controller``
through ``management_target`` over a ``MgmtBus`` and ``MgmtSession``,
blocking code run in a ``cocotb.task.bridge`` thread, its frames in and out
of the management port. The test ends in :meth:`MgmtSwitchTB.check`: every
result equals the model switch's byte for byte, every counter the model's
(management frames counted ``DROP_NON_ROCE``), every management response
the model bridge's, and the ``MGMT.*`` counters the model's.
"""

from __future__ import annotations

import itertools
import random

import cocotb
import numpy as np
import pytest
from cocotb.task import bridge

from inagg.host.controller import Controller, Plan, management_target
from inagg.host.mgmt import MgmtSession, MgmtTimeout
from inagg.models.job import SwitchSpec
from inagg.models.mgmt import Status, parse_response
from inagg.models.protocol import Counter
from inagg.models.regmap import RegMap
from inagg.testbench.mgmt import is_mgmt
from inagg.testbench.sim import parameters
from inagg.testbench.switch_tb import MgmtSwitchTB
from inagg.testbench.traffic import lanes, make_job, windowed

PARAMS = parameters()
KEY = bytes.fromhex(PARAMS["mgmt_key"])
HOST = "02:00:00:00:0a:01"
TIMEOUT = 20e-6  # simulated seconds before a session sends again: 5,000 cycles, ten times a response's longest here


@cocotb.test()
async def configured_through_frames(dut):
    """A job configured by the controller through frames alone, all-reduced beside reads; a replay and a wrong key
    refused and counted."""
    spec = SwitchSpec(ports=PARAMS["ports"], slots=PARAMS["slots"], chunk_bytes=PARAMS["chunk_bytes"])
    tb = await MgmtSwitchTB.start(dut, spec, port=PARAMS["mgmt_port"], key=KEY)
    session = MgmtSession(KEY, board=spec.mac, host=HOST, timeout=TIMEOUT)
    bus = tb.bus(session)
    job = make_job(spec, 1, 4, 0, spec.slots // 2)

    @bridge
    def configure():
        regmap = RegMap.from_jobs(bus.read(RegMap.switch("JOBS")))
        Controller(management_target(bus, regmap, spec), Plan(spec, (job,))).configure()  # reads CTRL back
        return regmap

    tb.regmap = await configure()
    tb.model.add_job(job)
    assert all(parse_response(KEY, f).status == Status.OK for f in tb.responses)
    configured = len(tb.responses)

    chunks = 8
    pyrng, rng = random.Random(PARAMS["width"]), np.random.default_rng(PARAMS["width"])
    traffic = windowed(spec, job, range(chunks), lambda c: np.stack([lanes(rng, spec) for _ in job.workers]), pyrng,
                       loss=0.1, dup=0.1)
    for p in range(tb.ports):
        tb.src[p].set_pause_generator(itertools.cycle([0] * (3 + p) + [1]))
        tb.snk[p].set_pause_generator(itertools.cycle([0, 1, 0, 0, 1] if p % 2 else [0, 0, 0, 1]))
    sending = cocotb.start_soon(tb.send_all(traffic, paced=True))  # the requests go in between the contributions
    ctrl = tb.regmap.job(job.job, "CTRL")
    # Answered between the port's results.
    assert await bridge(lambda: [bus.read(ctrl) for _ in range(4)])() == [RegMap.ctrl(job)] * 4
    await sending
    await tb.settle()
    on_port = tb.sent[tb.mgmt_port]
    last_data = max(i for i, f in enumerate(on_port) if not is_mgmt(f))
    assert sum(map(is_mgmt, on_port[:last_data])) > configured, "no request went in between the contributions"

    replayed = parse_response(KEY, await tb.exchange(tb.requests()[0]))
    assert (replayed.status, replayed.floor) == (Status.REPLAYED, session.seq - 1)
    wrong = tb.bus(MgmtSession(bytes(16), board=spec.mac, host=HOST, timeout=TIMEOUT / 4, tries=2))
    with pytest.raises(MgmtTimeout):
        await bridge(wrong.read)(RegMap.switch("ID"))

    @bridge
    def final():
        return [bus.read(a) for a in (RegMap.counter(Counter.COMPLETED), RegMap.mgmt_stat("bad_tag"),
                                      RegMap.mgmt_stat("replayed"))]

    assert await final() == [chunks, 2, 1]
    await tb.check()
    counters = await tb.counters()
    assert counters[Counter.DROP_NON_ROCE] == len(tb.requests())
    assert counters[Counter.RX_FRAMES] == len(traffic) + len(tb.requests())

"""The slot engine's slot decision on its own: SlotRules against the rules of protocol.md section 3."""

import pytest
from amaranth.sim import Simulator

from inagg.hdl.engine import SlotRules
from inagg.models.switch import SlotState

OUTCOMES = ("add", "store", "dup", "resend", "complete", "unknown_qpn", "collision", "stale", "window")


def _decide(meta, desc, gone=0):
    dut = SlotRules(workers=4, depth=16)
    seen = {}

    async def bench(ctx):
        for name, value in meta.items():
            ctx.set(getattr(dut.meta, name), value)
        for name, value in desc.items():
            ctx.set(getattr(dut.desc, name), value)
        ctx.set(dut.gone, gone)
        seen.update({name: ctx.get(getattr(dut.outcome, name)) for name in OUTCOMES})
        seen["new"] = {name: ctx.get(getattr(dut.new, name)) for name in ("state", "bitmap", "count", "first")}

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    return seen


DESC = dict(job=1, worker=2, chunk=9, slot=1, workers=2, slots=8)


@pytest.mark.parametrize("meta, gone, outcome, new", [
    (dict(state=SlotState.FREE), 0, {"add", "store"}, dict(state=SlotState.AGG, bitmap=0b100, count=1, first=1)),
    (dict(state=SlotState.AGG, job=1, chunk=9, bitmap=0b1, count=1, first=1), 0, {"add", "complete"},
     dict(state=SlotState.DONE, bitmap=0b101, count=2, first=0)),
    (dict(state=SlotState.AGG, job=1, chunk=9, bitmap=0b1, count=1), 0, {"add", "complete"},
     dict(state=SlotState.DONE, bitmap=0b101, count=2, first=0)),
    # Liveness: a slot that never completed restarts with any other chunk of its job, older or far ahead.
    (dict(state=SlotState.AGG, job=1, chunk=10, bitmap=0b100, count=1, first=1), 0, {"add", "store"},
     dict(state=SlotState.AGG, bitmap=0b100, count=1, first=1)),
    (dict(state=SlotState.AGG, job=1, chunk=9 + 2**31, bitmap=0b1, count=1, first=1), 0, {"add", "store"},
     dict(state=SlotState.AGG, bitmap=0b100, count=1, first=1)),
    (dict(state=SlotState.AGG, job=3, chunk=1, first=1), 0, {"collision"}, None),
    (dict(state=SlotState.DONE, job=1, chunk=9, bitmap=0b101, count=2), 0, {"dup", "resend"}, None),
    (dict(state=SlotState.AGG, job=1, chunk=9, bitmap=0b100, count=1), 0, {"dup"}, None),
    (dict(state=SlotState.AGG, job=3, chunk=9), 0, {"collision"}, None),
    (dict(state=SlotState.AGG, job=1, chunk=10), 0, {"stale"}, None),
    (dict(state=SlotState.AGG, job=1, chunk=1), 0, {"window"}, None),
    (dict(state=SlotState.DONE, job=1, chunk=1, bitmap=0b11, count=2), 0, {"add", "store"},
     dict(state=SlotState.AGG, bitmap=0b100, count=1, first=0)),
    (dict(state=SlotState.FREE), 1, {"unknown_qpn"}, None),
])
def test_slot_rules(meta, gone, outcome, new):
    seen = _decide(meta, DESC, gone)
    assert {name for name in OUTCOMES if seen[name]} == outcome
    if new is not None:
        assert seen["new"] == {k: int(v) for k, v in new.items()}

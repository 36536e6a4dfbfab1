"""The switch with its management bridge in the Amaranth simulator: configured through frames, beside an all-reduce.

Every register write that configures the job goes in as a management frame on port 0; then the workers'
contributions go in on both ports, port 0's between management requests (a read, a wrongly keyed write, a replayed
write), and a request goes in on the other port, which has no bridge. Results and counters are compared with the
model switch (management frames are ``DROP_NON_ROCE`` there, ``docs/protocol.md`` section 12), management responses
byte for byte with the model bridge.
"""

import gc
import itertools
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from inagg.hdl.switch import Switch, check_parameters
from inagg.models import regmap as rm
from inagg.models.geometry import SwitchGeometry
from inagg.models.job import SwitchSpec
from inagg.models.mgmt import MgmtBridge as ModelBridge
from inagg.models.mgmt import Op, Status, parse_response, request_frame
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.testbench.axil_sim import axil_read
from inagg.testbench.mgmt import Registers, is_mgmt
from inagg.testbench.replay import assert_frames_match, replay
from inagg.testbench.streams import get_frame, put_frame
from inagg.testbench.traffic import contribution, lanes, make_job

KEY = bytes(range(16))
HOST = "02:00:00:00:0a:01"
ANSWER = 400  # cycles a response may take behind the port's results (about 40 alone)
QUIET = 200   # cycles without an output beat that end the traffic


def _req(op, seq, addr, data=0, key=KEY, dst="ff:ff:ff:ff:ff:ff"):
    return request_frame(key, dst=dst, src=HOST, op=op, seq=seq, addr=addr, data=data)


@pytest.mark.parametrize("width, mgmt_port", [(64, 0), (256, 1)])
def test_configured_through_frames_beside_an_allreduce(width, mgmt_port):
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    job = make_job(spec, 1, 4, 0, 4)
    geometry = SwitchGeometry.for_spec(spec, width=width, jobs=2, workers=4)
    regmap = geometry.regmap
    dut = Switch(geometry, mgmt_port=mgmt_port, mgmt_key=KEY)
    k, other = mgmt_port, 1 - mgmt_port
    rng = np.random.default_rng(width)
    chunks = 3
    data = {p: [] for p in range(spec.ports)}
    for c in range(chunks):
        for w, ws in enumerate(job.workers):
            data[ws.port].append(contribution(spec, job, w, c, lanes(rng, spec)))

    seq = itertools.count(1)
    writes = regmap.switch_writes(spec) + regmap.job_writes(job, spec)
    config = [_req(Op.WRITE, next(seq), a, v) for a, v in writes] + [_req(Op.READ, next(seq), regmap.job(1, "CTRL"))]
    ip = regmap.switch("IP")
    # Port k's traffic after the configuration: (frame, answered), management requests between its contributions.
    mixed = [(data[k][0], False), (_req(Op.READ, next(seq), ip), True),
             (data[k][1], False), (_req(Op.WRITE, 1000, ip, 0xBAD, key=bytes(16)), False),  # wrong key
             (data[k][2], False), (config[0], True),                                          # replayed: REPLAYED
             *[(f, False) for f in data[k][3:]], (_req(Op.READ, next(seq), ip), True)]
    final = [_req(Op.READ, next(seq), a) for a in (regmap.counter(Counter.COMPLETED), regmap.mgmt_stat("bad_tag"))]
    # On the other port, a request above every sequence number here: that port has no bridge, so it is a frame
    # that is not RoCEv2 there, and the floor stays (were it taken, the later requests would be REPLAYED).
    sent = {k: config + [f for f, _ in mixed] + final, other: [_req(Op.WRITE, 500, ip, 0xBAD)] + data[other]}
    received = {p: [] for p in range(spec.ports)}
    responses, order, configured, done = [], [], [], []
    counters, stats = {}, {}

    async def answer(ctx, n):
        for _ in range(ANSWER):
            if len(responses) > n:
                return
            await ctx.tick()
        raise AssertionError(f"no management response within {ANSWER} cycles")

    async def exchange(ctx, frame, answered=True):
        n = len(responses)
        await put_frame(ctx, dut.s[k], frame, width)
        if answered:
            await answer(ctx, n)
        elif is_mgmt(frame):
            for _ in range(40):  # the bridge refuses it without an answer and is idle again
                await ctx.tick()

    async def management_port(ctx):
        for frame in config:
            await exchange(ctx, frame)
        configured.append(True)
        for frame, answered in mixed:
            await exchange(ctx, frame, answered)
        while not done:
            await ctx.tick()
        quiet = 0
        while quiet < QUIET:
            await ctx.tick()
            quiet = 0 if any(ctx.get(m.valid) for m in dut.m) else quiet + 1
        for frame in final:  # the job is done: the counters read now are the model's at the end
            await exchange(ctx, frame)
        for c in Counter:
            counters[c], resp = await axil_read(ctx, dut.axil, regmap.counter(c))
            assert resp == 0
        for name in rm.MGMT_STATS:
            stats[name], resp = await axil_read(ctx, dut.axil, regmap.mgmt_stat(name))
            assert resp == 0

    async def other_port(ctx):
        while not configured:
            await ctx.tick()
        for frame in sent[other]:
            await put_frame(ctx, dut.s[other], frame, width, itertools.cycle([0, 0, 1]))
        done.append(True)

    def receiver(p):
        async def run(ctx):
            pause = itertools.cycle([0, 1, 0, 0])
            while True:
                frame = await get_frame(ctx, dut.m[p], width, pause)
                (responses if p == k and is_mgmt(frame) else received[p]).append(frame)
        return run

    async def watch(ctx):
        async for _, _, valid, port in ctx.tick().sample(dut.order.valid, dut.order.p.port):
            if valid:
                order.append(port)

    sim = Simulator(dut)
    sim.add_clock(4e-9)
    sim.add_testbench(management_port)
    sim.add_testbench(other_port)
    for p in range(spec.ports):
        sim.add_testbench(receiver(p), background=True)
    sim.add_process(watch)
    sim.run()

    model = ModelSwitch(spec)
    model.add_job(job)
    expected = replay(model, sent, order)
    assert_frames_match(received, expected)
    diff = {c.name: (counters[c], model.counters[c]) for c in Counter if counters[c] != model.counters[c]}
    assert not diff, f"counters differ (rtl, model): {diff}"
    regs = Registers(regmap, lambda: model.counters)
    bridge = ModelBridge(KEY, regs.read, regs.write, regmap.addr_width)
    want = [r for r in (bridge.receive(f)[0] for f in sent[k] if is_mgmt(f)) if r is not None]
    assert responses == want
    assert stats == bridge.counters
    got = [parse_response(KEY, f) for f in responses]
    assert [r.status for r in got[:len(config)]] == [Status.OK] * len(config)
    assert got[len(config) - 1].data == regmap.ctrl(job)
    assert [r.status for r in got[len(config):]] == [Status.OK, Status.REPLAYED, Status.OK, Status.OK, Status.OK]
    assert [r.data for r in got[-2:]] == [chunks, 1]  # every chunk completed; the wrong key counted
    assert counters[Counter.COMPLETED] == chunks
    assert counters[Counter.DROP_NON_ROCE] == sum(map(is_mgmt, sent[k] + sent[other]))
    assert not any(map(is_mgmt, received[other]))
    assert stats == {"accepted": len(config) + 4, "malformed": 0, "bad_op": 0, "bad_tag": 1, "replayed": 1,
                     "busy": 0}


@pytest.mark.parametrize("params, message", [
    ({"mgmt_port": 2, "mgmt_key": KEY}, r"Management port must be an integer in 0\.\.1, not 2"),
    ({"mgmt_port": -1, "mgmt_key": KEY}, r"Management port must be an integer in 0\.\.1, not -1"),
    ({"mgmt_port": True, "mgmt_key": KEY}, r"Management port must be an integer in 0\.\.1, not True"),
    ({"mgmt_port": 0}, "Management key must be 16 bytes, not None"),
    ({"mgmt_port": 1, "mgmt_key": bytes(8)}, "Management key must be 16 bytes"),
    ({"mgmt_key": KEY}, r"A management key needs a management port \(mgmt_port\)"),
])
def test_parameter_checks(params, message):
    geometry = dict(ports=2, width=64, slots=16, chunk_bytes=256, jobs=2, workers=4)
    with pytest.raises(ValueError, match=message):
        check_parameters(**geometry, **params)
    with warnings.catch_warnings():
        # The refused switch was never meant to be elaborated.
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=message) as refused:
            Switch(**geometry, **params)
        del refused
        gc.collect()

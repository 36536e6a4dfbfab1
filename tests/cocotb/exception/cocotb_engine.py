"""cocotb testbench of the Verilated :class:`~inagg.hdl.exception.ExceptionEngine` against the model.

Run by ``test_exception.py`` beside it, on a build of :func:`inagg.testbench.sim.build`.
Inputs are written on the falling edge; ``ReadOnly`` then samples what the
engine answers before the next rising edge, which is when a transfer with
both ``valid`` and ``ready`` high takes place.
"""

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly

from inagg.hdl.exception import STATS, ExceptionEngine, Op, Status, response_layout, stats_layout
from inagg.testbench.exception.reference import Reference
from inagg.testbench.exception.state import decode
from inagg.testbench.exception.stimulus import random_requests, valid_pattern
from inagg.testbench.sim import parameters, stimulus


async def _reset(dut):
    Clock(dut.clk, 4, unit="ns").start()
    dut.req__valid.value = 0
    dut.resp__ready.value = 0
    dut.rst.value = 1
    for _ in range(2):
        await FallingEdge(dut.clk)
    dut.rst.value = 0


async def _run(dut, engine, ops, keys, gaps, pause):
    """Drive the requests, where ``gaps[t]`` allows the request stream to be valid in cycle t and
    ``pause[t]`` holds the response stream's ready low; return responses, held cycles, cycles."""
    n = len(ops)
    layout = response_layout(engine.key_width, engine.capacity)
    payloads = [int(k) << 2 | int(o) for o, k in zip(ops, keys)]  # request_layout: op in the low 2 bits
    responses, held, sent, t = [], 0, 0, 0
    limit = len(gaps)
    while len(responses) < n:
        assert t < limit, f"{len(responses)} of {n} responses after {limit} cycles"
        await FallingEdge(dut.clk)
        offer = sent < n and gaps[t]
        dut.req__valid.value = int(offer)
        if offer:
            dut.req__payload.value = payloads[sent]
        take = not pause[t]
        dut.resp__ready.value = int(take)
        await ReadOnly()
        if offer:
            if dut.req__ready.value:
                sent += 1
            else:
                held += 1
        if take and dut.resp__valid.value:
            p = layout.from_bits(dut.resp__payload.value.to_unsigned())
            responses.append((Status(p.status), int(p.ptr), int(p.key)))
        t += 1
    await FallingEdge(dut.clk)
    dut.req__valid.value = 0
    dut.resp__ready.value = 0
    return responses, held, t


def _state(dut, engine):
    core = dut.core  # the logic behind the queues (ExceptionEngine.elaborate's submodule "core")
    tables = tuple([int(getattr(core, name)[i].value.to_unsigned()) for i in range(engine.table)]
                   for name in ("t0", "t1"))
    free_list = [int(core.free_list[i].value.to_unsigned()) for i in range(engine.capacity)]
    count = int(core.stash_count.value.to_unsigned()) if engine.stash else 0
    stash = [(int(getattr(core, f"stash{i}_key").value.to_unsigned()),
              int(getattr(core, f"stash{i}_ptr").value.to_unsigned())) for i in range(count)]
    raw = stats_layout().from_bits(dut.stats.value.to_unsigned())
    stats = {name: int(getattr(raw, name)) for name in STATS}
    return decode(engine, tables, free_list, int(core.free_first.value.to_unsigned()),
                  int(core.free_count.value.to_unsigned()), stash, stats), stats["stalls"]


def _settings():
    """The engine the build was made of (its layouts), and the stimulus's jobs and slots per job."""
    s = stimulus()
    return ExceptionEngine(**parameters()), s["jobs"], s["slots"]


async def _against_the_model(dut, n, seed, idle, paused):
    engine, jobs, slots = _settings()
    rng = np.random.default_rng(seed)
    ops, keys = random_requests(rng, n, jobs, slots)
    ref = Reference(engine.table, engine.max_kicks, engine.stash, jobs, slots)
    want, loads = [], np.zeros(n)
    for i, (op, key) in enumerate(zip(ops, keys)):
        want.append(ref.request(Op(int(op)), int(key)))
        loads[i] = ref.load
    cycles = 8 * (engine.capacity + n * (2 * engine.max_kicks + 2) + int((ops == Op.TEARDOWN.value).sum()) * slots)
    await _reset(dut)
    responses, held, t = await _run(dut, engine, ops, keys, valid_pattern(rng, cycles, idle),
                                    ~valid_pattern(rng, cycles, paused))
    for i, ((status, ptr), got) in enumerate(zip(want, responses)):
        assert got == (status, ptr, int(keys[i])), \
            f"request {i} {Op(int(ops[i])).name} 0x{int(keys[i]):08x}: engine {got}, model {(status, ptr)}"
    await ReadOnly()
    state, stalls = _state(dut, engine)
    diff = ref.state().diff(state)
    assert not diff, diff
    assert stalls == held
    s = state.stats
    # The stream must have driven the table through its hard cases, or this test proves little. (A
    # table this size refuses keys before its last entry fills: "full" is the unit tests' case.)
    assert loads.max() > 0.45 and s["kicks"] and s["stashed"] and s["refused"] and s["deletes"]
    statuses = {st for st, _ in want}
    assert statuses == set(Status), f"statuses never seen: {set(Status) - statuses}"
    dut._log.info("%d requests in %d cycles equal the model's; load %.2f..%.2f (mean %.2f); stats %s; %d stalls",
                  n, t, loads.min(), loads.max(), loads.mean(), s, stalls)


@cocotb.test()
async def random_stream_with_gaps_and_backpressure(dut):
    """The stimulus's requests and seed, 20% idle cycles in, ready low 30% of the cycles out."""
    s = stimulus()
    await _against_the_model(dut, s["requests"], s["seed"], 0.2, 0.3)


@cocotb.test()
async def random_stream_back_to_back(dut):
    """A fifth as many requests of another seed, with no idle cycle and the response stream always ready."""
    s = stimulus()
    await _against_the_model(dut, s["requests"] // 5, s["seed"] + 1, 0.0, 0.0)

"""Run a request stream through the exception engine in the Amaranth simulator."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from inagg.hdl.exception import STATS, ExceptionEngine, Op, Status
from inagg.models.cuckoo import KEY_INDEX_BITS

from inagg.testbench.exception.reference import State
from inagg.testbench.exception.state import decode

__all__ = ["Run", "simulate"]


@dataclass
class Run:
    """What the engine did: one ``(status, ptr, key)`` per request, in order; the cycle each request
    was taken and each response given (cycle 0 is the first after reset); the cycles a request
    waited for ``req.ready`` (``held``); the engine's state and ``stats.stalls`` at the end."""

    responses: list[tuple[Status, int, int]]
    accepted: list[int]
    answered: list[int]
    held: int
    state: State
    stalls: int


def simulate(engine: ExceptionEngine, ops: np.ndarray, keys: np.ndarray, *, gaps: Iterator[int] | None = None,
             pause: Iterator[int] | None = None, limit: int | None = None, engine_period: float = 2.3e-8,
             before: tuple[np.ndarray, np.ndarray] | None = None) -> Run:
    """Send requests ``(ops[i], keys[i])`` and take every response.

    ``before`` (ops, keys) are sent first, back to back, and answered; then
    every domain of the engine is reset, and the run is of what follows
    (a reset must leave the engine as new).

    ``gaps`` (0/1 per cycle) holds the request stream idle where it yields
    1, ``pause`` holds the response stream's ready low. The streams' clock
    has a period of 10 ns; an engine in a domain of its own gets a clock of
    ``engine_period`` seconds. Raises
    ``AssertionError`` when the responses have not all come after ``limit``
    cycles of the streams' clock (default: four times the longest the requests can take).
    """
    n = len(ops)
    gaps = gaps if gaps is not None else itertools.repeat(0)
    pause = pause if pause is not None else itertools.repeat(0)
    ops, keys = [int(o) for o in ops], [int(k) for k in keys]
    if limit is None:
        worst = [key % (1 << KEY_INDEX_BITS) + 1 if op == Op.TEARDOWN.value else 2 * engine.max_kicks + 2
                 for op, key in zip(ops, keys)]
        limit = 4 * (engine.capacity + sum(worst)) + 1000
        if engine.domain != "sync":
            limit = int(limit * max(1.0, engine_period / 1e-8))
    req, resp = engine.req, engine.resp
    run = Run([], [], [], 0, None, 0)
    top = Module()
    domains = [ClockDomain("sync")] + ([ClockDomain(engine.domain)] if engine.domain != "sync" else [])
    top.domains += domains
    top.submodules.engine = engine
    reset_done = [before is None]

    async def producer(ctx):
        if before is not None:
            for op, key in zip(*before):
                ctx.set(req.valid, 1)
                ctx.set(req.payload.op, int(op))
                ctx.set(req.payload.key, int(key))
                await ctx.tick().until(req.ready)
            ctx.set(req.valid, 0)
            while not reset_done[0]:
                await ctx.tick()
        t = 0
        for op, key in zip(ops, keys):
            while next(gaps):
                ctx.set(req.valid, 0)
                await ctx.tick()
                t += 1
            ctx.set(req.valid, 1)
            ctx.set(req.payload.op, op)
            ctx.set(req.payload.key, key)
            while True:
                _, _, ready = await ctx.tick().sample(req.ready)
                t += 1
                if ready:
                    run.accepted.append(t - 1)
                    break
                run.held += 1
        ctx.set(req.valid, 0)

    async def consumer(ctx):
        if before is not None:
            for _ in range(len(before[0])):
                ctx.set(resp.ready, 1)
                await ctx.tick().until(resp.valid)
            ctx.set(resp.ready, 0)
            for cd in domains:
                ctx.set(cd.rst, 1)
            # Long enough for an edge of the slowest clock.
            for _ in range(2 + int(engine_period / 1e-8)):
                await ctx.tick()
            for cd in domains:
                ctx.set(cd.rst, 0)
            reset_done[0] = True
        t = 0
        while len(run.responses) < n:
            assert t < limit, f"{len(run.responses)} of {n} responses after {limit} cycles"
            ctx.set(resp.ready, 0 if next(pause) else 1)
            _, _, valid, ready, p = await ctx.tick().sample(resp.valid, resp.ready, resp.payload)
            t += 1
            if valid and ready:
                run.responses.append((Status(p.status), int(p.ptr), int(p.key)))
                run.answered.append(t - 1)
        ctx.set(resp.ready, 0)
        tables = tuple([ctx.get(mem.data[i]).as_bits() for i in range(engine.table)] for mem in engine.tables)
        free_list = [ctx.get(engine.free_list.data[i]) for i in range(engine.capacity)]
        count = ctx.get(engine.stash_count)
        stash = [(ctx.get(engine.stash_keys[i]), ctx.get(engine.stash_ptrs[i])) for i in range(count)]
        stats = {name: ctx.get(getattr(engine.stats, name)) for name in STATS}
        run.stalls = stats["stalls"]
        run.state = decode(engine, tables, free_list, ctx.get(engine.free_first), ctx.get(engine.free_count),
                           stash, stats)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    if engine.domain != "sync":
        sim.add_clock(engine_period, domain=engine.domain)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return run

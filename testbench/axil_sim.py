"""An AXI4-Lite manager for the Amaranth simulator (cocotb tests use cocotbext-axi instead)."""

from __future__ import annotations

__all__ = ["axil_write", "axil_read"]


async def axil_write(ctx, bus, addr: int, value: int) -> int:
    """Write ``value`` at ``addr``; return BRESP."""
    ctx.set(bus.awaddr, addr)
    ctx.set(bus.wdata, value)
    ctx.set(bus.wstrb, 0xF)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wvalid, 1)
    await ctx.tick().until(bus.awready)
    ctx.set(bus.awvalid, 0)
    ctx.set(bus.wvalid, 0)
    ctx.set(bus.bready, 1)
    resp, = await ctx.tick().sample(bus.bresp).until(bus.bvalid)
    ctx.set(bus.bready, 0)
    return resp


async def axil_read(ctx, bus, addr: int) -> tuple[int, int]:
    """Read ``addr``; return (RDATA, RRESP)."""
    ctx.set(bus.araddr, addr)
    ctx.set(bus.arvalid, 1)
    await ctx.tick().until(bus.arready)
    ctx.set(bus.arvalid, 0)
    ctx.set(bus.rready, 1)
    data, resp = await ctx.tick().sample(bus.rdata, bus.rresp).until(bus.rvalid)
    ctx.set(bus.rready, 0)
    return data, resp

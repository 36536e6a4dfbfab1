"""Management frames in testbenches: the register map as the model bridge sees it, and frames told apart.

:class:`inagg.models.mgmt.MgmtBridge` reads and writes registers through
two callables; :class:`Registers` gives it the part of
:class:`~inagg.hdl.control.Control` that tests' requests touch, so that its
responses can be compared with the gateware's byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from inagg.models import regmap as rm
from inagg.models.frame import ETHERNET, MGMT_ETHER_TYPE
from inagg.models.protocol import Counter

__all__ = ["Registers", "is_mgmt"]

_RESET = {"PKEY": 0xFFFF}  # the one switch register that does not reset to 0 (regmap: PKEY)


def is_mgmt(frame: bytes) -> bool:
    """``frame`` is a management frame (its EtherType), as a port's egress carries responses among results."""
    return len(frame) >= ETHERNET.size and ETHERNET.unpack(frame)["ether_type"] == MGMT_ETHER_TYPE


class Registers:
    """What ``Control`` answers to the accesses of the tests' management requests.

    ``ID`` and ``JOBS`` read their constants, the counters read
    ``counters()`` (the model switch's; 0 without it), the switch's and the
    jobs' registers that are read-write as a whole read back what was
    written (to the register's width, from their reset values), the worker
    registers take writes and refuse reads (write-only); every other access
    is refused (SLVERR: ``None`` or ``False``). ``CTRL`` writes are taken
    as written: the tests' jobs are ones the switch enables.
    """

    def __init__(self, regmap: rm.RegMap, counters: Callable[[], Mapping[Counter, int]] | None = None):
        self.regmap, self._counters = regmap, counters
        self.registers: dict[int, rm.Register] = {}
        for r in rm.SWITCH_REGISTERS.values():
            self.registers[r.offset] = r
        for j in range(regmap.jobs):
            for name, r in rm.JOB_REGISTERS.items():
                self.registers[regmap.job(j, name)] = r
            for w in range(regmap.workers):
                for name, r in rm.WORKER_REGISTERS.items():
                    self.registers[regmap.worker(j, w, name)] = r
        self.values = {addr: _RESET.get(r.name, 0) for addr, r in self.registers.items()}

    def _plain(self, addr: int, access: str) -> bool:
        """``addr`` is a register of ``access`` whose fields all have it (not ``TEARDOWN``'s mixed ones)."""
        r = self.registers.get(addr)
        return r is not None and r.access == access and all(f.access == access for f in r.fields)

    def read(self, addr: int) -> int | None:
        if addr == rm.RegMap.switch("ID"):
            return rm.ID_VALUE
        if addr == rm.RegMap.switch("JOBS"):
            return self.regmap.jobs_value()
        if rm.COUNTER_BASE <= addr < rm.COUNTER_BASE + 4 * len(Counter) and addr % 4 == 0:
            counters = self._counters() if self._counters is not None else {}
            return counters.get(Counter((addr - rm.COUNTER_BASE) // 4), 0) & 0xFFFFFFFF
        return self.values[addr] if self._plain(addr, "RW") else None

    def write(self, addr: int, value: int) -> bool:
        if not (self._plain(addr, "RW") or self._plain(addr, "WO")):
            return False
        self.values[addr] = value & ((1 << self.registers[addr].width) - 1)
        return True

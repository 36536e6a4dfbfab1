"""Management frames in testbenches: the register map as the model bridge sees it, and frames told apart.

:class:`inagg.models.mgmt.MgmtBridge` reads and writes registers through
two callables; :class:`Registers` gives it the part of
:class:`~inagg.hdl.control.Control` that tests' requests touch, so that its
responses can be compared with the gateware's byte for byte.
:class:`ModelBoard` is a board in software: the model switch whose jobs
are configured by management frames on one port, as the gateware's are
(the stand-in for the board at the far end of a cable in
``tests/host/test_iface.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from inagg.models import regmap as rm
from inagg.models.frame import ETHERNET, MGMT_ETHER_TYPE
from inagg.models.job import JobSpec, WorkerSpec
from inagg.models.mgmt import MgmtBridge
from inagg.models.protocol import Counter

__all__ = ["Registers", "is_mgmt", "ModelBoard"]

_RESET = {"PKEY": 0xFFFF}  # the one switch register that does not reset to 0 (regmap: PKEY)


def is_mgmt(frame: bytes) -> bool:
    """``frame`` is a management frame (its EtherType), as a port's egress carries responses among results."""
    return len(frame) >= ETHERNET.size and ETHERNET.unpack(frame)["ether_type"] == MGMT_ETHER_TYPE


class Registers:
    """What ``Control`` answers to the accesses of the tests' management requests.

    ``ID`` and ``JOBS`` read their constants, ``GEOMETRY`` ``geometry``
    (refused when None), the counters read
    ``counters()`` (the model switch's; 0 without it), the switch's and the
    jobs' registers that are read-write as a whole read back what was
    written (to the register's width, from their reset values), the worker
    registers take writes and refuse reads (write-only); every other access
    is refused (SLVERR: ``None`` or ``False``). ``CTRL`` writes are taken
    as written: the tests' jobs are ones the switch enables.
    """

    def __init__(self, regmap: rm.RegMap, counters: Callable[[], Mapping[Counter, int]] | None = None,
                 geometry: int | None = None):
        self.regmap, self._counters, self._geometry = regmap, counters, geometry
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
        if addr == rm.RegMap.switch("GEOMETRY") and self._geometry is not None:
            return self._geometry
        if rm.COUNTER_BASE <= addr < rm.COUNTER_BASE + 4 * len(Counter) and addr % 4 == 0:
            counters = self._counters() if self._counters is not None else {}
            return counters.get(Counter((addr - rm.COUNTER_BASE) // 4), 0) & 0xFFFFFFFF
        return self.values[addr] if self._plain(addr, "RW") else None

    def write(self, addr: int, value: int) -> bool:
        if not (self._plain(addr, "RW") or self._plain(addr, "WO")):
            return False
        self.values[addr] = value & ((1 << self.registers[addr].width) - 1)
        return True


def _mac(value: int) -> str:
    return ":".join(f"{b:02x}" for b in value.to_bytes(6, "big"))


class ModelBoard(Registers):
    """A model switch configured through its register map, with the management bridge on port ``mgmt_port``.

    A ``CTRL`` write that enables a job installs on ``switch`` the
    :class:`~inagg.models.job.JobSpec` its job and worker registers
    describe (SLVERR when the switch refuses it, as the gateware refuses a
    mode it lacks), a write to ``TEARDOWN`` removes the job, and
    ``TEARDOWN`` reads idle. The switch's own addresses are those of its
    ``SwitchSpec``: writes of ``MAC_HI``, ``MAC_LO``, ``IP`` and ``PKEY``
    are kept but do not change them. The board is a data plane for
    :func:`inagg.host.netns.serve_switch`: management frames on
    ``mgmt_port`` go to the bridge (``bridge.counters`` counts them), every
    other frame to the switch.

    Ports ``0 .. mac_ports - 1`` have a MAC on a link without faults: its
    counters (``mac_stats``, read at ``RegMap.mac_stat``) count every frame
    taken as ``rx_good`` before the board acts on it and every frame sent
    as ``tx_frames``, the gateware MAC's order, so that a read of the
    management port counts its own request; the error counters stay 0.
    """

    def __init__(self, switch, regmap: rm.RegMap, key: bytes, *, mgmt_port: int = 0, mac_ports: int = 0):
        # GEOMETRY as the smallest board build's (W = 64) with the model's slots and chunks.
        super().__init__(regmap, counters=lambda: switch.counters, geometry=rm.RegMap.geometry(switch.spec, 64))
        self.switch, self.mgmt_port = switch, mgmt_port
        self.bridge = MgmtBridge(key, self.read, self.write, regmap.addr_width)
        self.mac_stats = [dict.fromkeys(rm.MAC_STATS, 0) for _ in range(mac_ports)]
        self._mac_addrs = {rm.RegMap.mac_stat(p, name): (p, name) for p in range(mac_ports) for name in rm.MAC_STATS}

    def read(self, addr: int) -> int | None:
        if addr == rm.RegMap.switch("TEARDOWN"):
            return 0
        if addr in self._mac_addrs:
            port, name = self._mac_addrs[addr]
            return self.mac_stats[port][name] & 0xFFFFFFFF
        return super().read(addr)

    def write(self, addr: int, value: int) -> bool:
        if addr == rm.RegMap.switch("TEARDOWN"):
            job = rm.TEARDOWN.decode(value)["job"]
            if job not in self.switch.jobs:
                return False
            self.switch.remove_job(job)
            return True
        if not super().write(addr, value):
            return False
        for j in range(self.regmap.jobs):
            if addr == self.regmap.job(j, "CTRL") and rm.JOB_CTRL.decode(value)["enable"]:
                try:
                    self.switch.add_job(self._job(j, rm.JOB_CTRL.decode(value)))
                except ValueError:
                    self.values[addr] = 0
                    return False
        return True

    def _job(self, j: int, ctrl: dict[str, int]) -> JobSpec:
        """Job ``j`` as its registers describe it."""
        def reg(w, name):
            return self.values[self.regmap.worker(j, w, name)]

        workers = tuple(WorkerSpec(port=reg(w, "PORT"), mac=_mac(reg(w, "MAC_HI") << 32 | reg(w, "MAC_LO")),
                                   ip=".".join(str(b) for b in reg(w, "IP").to_bytes(4, "big")), qpn=reg(w, "QPN"),
                                   rkey=reg(w, "RKEY"), result_va=reg(w, "VA_HI") << 32 | reg(w, "VA_LO"),
                                   result_psn=reg(w, "PSN"), contrib_rkey=reg(w, "CONTRIB_RKEY"))
                        for w in range(ctrl["workers"]))
        mode = next(m for m, code in rm.MODE_CODES.items() if code == ctrl["mode"])
        return JobSpec(job=j, rkey=workers[0].contrib_rkey, slot_base=self.values[self.regmap.job(j, "SLOT_BASE")],
                       slots=self.values[self.regmap.job(j, "SLOTS")], workers=workers, mode=mode)

    @property
    def deadline(self) -> float | None:
        """The switch's next timer (the bridge has none)."""
        return self.switch.deadline

    def on_timer(self, now: float) -> list[tuple[int, bytes]]:
        """What the switch's timers due by ``now`` send."""
        return self._sent(self.switch.on_timer(now))

    def receive(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """What the board sends when ``frame`` arrives on ``port``."""
        if port < len(self.mac_stats):
            self.mac_stats[port]["rx_good"] += 1
        if port == self.mgmt_port and is_mgmt(frame):
            answer, _ = self.bridge.receive(frame)
            return self._sent([] if answer is None else [(port, answer)])
        return self._sent(self.switch.receive(port, frame))

    def _sent(self, out: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        for port, _ in out:
            if port < len(self.mac_stats):
                self.mac_stats[port]["tx_frames"] += 1
        return out

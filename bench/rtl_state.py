"""Block-RAM bits of state per job in the RTL switch, against the model's (docs/protocol.md section 9).

    .venv/bin/python bench/rtl_state.py          (or: python -m bench rtl_state)

Elaborates ``hdl.switch.Switch`` at EPIC's operating point (W = 512 bits,
C = 1024 B, a region of 2W = 256 slots for one job) without and with Mode
III, at 8 and 32 children, and reads every memory off the design: its
entry width and depth. Each memory is named in :data:`ROLES` with what
its entries are indexed by and which modes use it; an unnamed memory
fails the run, so the table follows the gateware. Queues (FIFO storage)
and configuration (the worker table's addresses and keys) are not state,
as ``models.state`` does not count them. The model's figures are
``models.state.job_state`` at the same point (``bench/modes.py --state``).
Writes docs/results/rtl_state.md. The figures depend on the code only.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._report import head_commit, publish  # noqa: E402

from amaranth.hdl import Fragment, Shape  # noqa: E402
from amaranth.hdl._mem import MemoryInstance  # noqa: E402

from inagg.hdl.switch import Switch  # noqa: E402
from inagg.models.job import Mode  # noqa: E402
from inagg.models.protocol import QPN_WORKER_BITS  # noqa: E402
from inagg.models.state import job_state, window_for  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "rtl_state.md"
COMMAND = ".venv/bin/python bench/rtl_state.py"
LINK_BPS, RTT, CHUNK, WIDTH, PORTS = 100e9, 10e-6, 1024, 512, 2
CHILDREN = (8, 32)

SLOT, CHILD, WORKER = "slot", "(job, child)", "worker"
UC, II, III = Mode.UC, Mode.TRANSLATED, Mode.AUGMENTED


@dataclass(frozen=True)
class Role:
    """What a memory's entries are indexed by, and the modes whose jobs keep state in it (empty: not state)."""

    index: str
    modes: frozenset
    what: str


def _state(index, modes, what):
    return Role(index, frozenset(modes), what)


_CONFIG = Role("", frozenset(), "configuration")
_QUEUE = Role("", frozenset(), "a queue or frame buffer")
# By the memory's path below the switch, its leading parts as the design names them.
ROLES = {
    "engine.lanes": _state(SLOT, (UC, II, III), "lane words and promotion flags, one entry per beat"),
    "engine.meta": _state(SLOT, (UC, II, III), "slot metadata: state, job, chunk, bitmap, count, PSN"),
    "engine.psns.mem": _state(CHILD, (II, III), "expected PSN and Mode III's NAK-sent flag"),
    "engine.acks.words": _state(SLOT, (III,), "result PSN, children that ACKed it, completion stamp"),
    "engine.acks.points.mem": _state(CHILD, (III,), "ACK point: oldest result PSN not ACKed"),
    "engine.acks.stamps": _state(CHILD, (III,), "ACK timer: cycle of the last progress"),
    "control.workers.worker_psn0": _state(WORKER, (UC, II, III), "next result PSN"),
    "control.workers.worker_psn1": _state(WORKER, (UC, II, III), "next result PSN (copy for a second read port)"),
}
_CONFIG_TABLES = ("mac_hi", "mac_lo", "ip", "qpn", "rkey", "va_hi", "va_lo", "contrib_rkey", "port_copy")
ROLES.update({f"control.workers.worker_{name}": _CONFIG for name in _CONFIG_TABLES})


def _role(path: str) -> Role:
    if path in ROLES:
        return ROLES[path]
    if path.endswith(".storage") or path.endswith(".buf"):  # FIFOs and the emitters' frame buffers
        return _QUEUE
    raise KeyError(f"memory {path} has no role in bench/rtl_state.py ROLES: say what it holds")


def memories(dut) -> list[tuple[str, int, int]]:
    """(path, entry bits, depth) of every memory in ``dut``'s design."""
    found = []

    def walk(fragment, path):
        for sub, name, _ in fragment.subfragments:
            p = f"{path}.{name}" if path else str(name)
            if isinstance(sub, MemoryInstance):
                found.append((p, Shape.cast(sub._data.shape).width, sub._data.depth))
            else:
                walk(sub, p)
    walk(Fragment.get(dut, None), "")
    return found


@dataclass
class Row:
    build: str
    children: int
    mode: Mode
    slot_bits: int      # per slot of the region, lanes included
    child_bits: int     # per (job, child) entry
    worker_bits: int    # per worker entry
    reserved: int       # (job, child) entries a job holds in the RTL: every QPN worker number


def measure(augmented: bool, children: int) -> tuple[list[Row], list[tuple[str, int, int, Role]]]:
    slots = 2 * window_for(LINK_BPS, RTT, CHUNK)
    dut = Switch(ports=PORTS, width=WIDTH, slots=slots, chunk_bytes=CHUNK, jobs=1, workers=children,
                 augmented=augmented)
    mems = [(p, w, d, _role(p)) for p, w, d in memories(dut)]
    rows = []
    for mode in (UC, II) + ((III,) if augmented else ()):
        bits = {SLOT: 0, CHILD: 0, WORKER: 0}
        for path, width, depth, role in mems:
            if mode not in role.modes:
                continue
            per = {SLOT: slots, CHILD: 1 << QPN_WORKER_BITS, WORKER: children}[role.index]
            assert depth % per == 0, f"{path}: {depth} entries are not whole {role.index} entries"
            bits[role.index] += width * depth // per
        rows.append(Row("Mode III build" if augmented else "default build", children, mode, bits[SLOT],
                        bits[CHILD], bits[WORKER], 1 << QPN_WORKER_BITS))
    return rows, mems


def main() -> int:
    w = window_for(LINK_BPS, RTT, CHUNK)
    slots = 2 * w
    lane_bits = CHUNK * 8
    table, inventory = [], None
    for augmented in (False, True):
        for n in CHILDREN:
            rows, mems = measure(augmented, n)
            if augmented and n == CHILDREN[0]:
                inventory = mems
            for r in rows:
                model = job_state(r.mode, workers=n, window=w, chunk_bytes=CHUNK)
                used = r.slot_bits * slots + (r.child_bits + r.worker_bits) * n
                reserved = r.slot_bits * slots + r.child_bits * r.reserved + r.worker_bits * n
                table.append(
                    f"| {r.build} | {r.mode.value} | {n} | {r.slot_bits - lane_bits} | {model.slot_bits} | "
                    f"{r.child_bits + r.worker_bits} | {model.child_bits} | {model.job_bits} | "
                    f"{math.ceil(used / 8):,} | {math.ceil(reserved / 8):,} | {model.total_bytes:,} |")
    listing = [f"| `{p}` | {wd} | {d:,} | {role.index or '-'} | "
               f"{', '.join(m.value for m in (UC, II, III) if m in role.modes) or '-'} | {role.what} |"
               for p, wd, d, role in inventory]
    publish(OUT, [
        "# Block-RAM state per job in the RTL switch",
        "",
        f"Command: `{COMMAND}` at commit {head_commit()}. The figures depend on the code only.",
        "",
        f"`Switch(ports={PORTS}, width={WIDTH}, slots={slots}, chunk_bytes={CHUNK}, jobs=1, workers=K)` at EPIC's "
        f"operating point (`docs/protocol.md` section 9: B = {LINK_BPS / 1e9:g} Gb/s, T = {RTT * 1e6:g} us, "
        f"W = {w}, a region of 2W = {slots} slots), the default build and the one with Mode III "
        "(`augmented=True`), K = 8 and 32. Each memory of the elaborated design is read off it (entry width, "
        "depth) and counted for the modes whose jobs keep state in it; queues and configuration are not state. "
        f"The lanes ({lane_bits:,} bits a slot, {lane_bits * slots // 8:,} bytes a job) are the same in every "
        "row and left out of the bits per slot. The model's columns are `models.state.job_state` "
        "(`docs/results/modes.md`, \"Switch state per job per mode\").",
        "",
        "| build | mode | children | RTL bits per slot | model bits per slot | RTL bits per child | "
        "model bits per child | model bits per job | RTL bytes per job, K children | "
        f"RTL bytes per job, {1 << QPN_WORKER_BITS} children reserved | model bytes per job |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *table,
        "",
        "What differs, and why:",
        "",
        "- **Per slot.** The RTL's slot word has a PSN field (24 bits, for Modes II and III) and a `first` and a "
        "`guest` flag in every build; the model's `Entry` keeps the bitmap of children that ACKed a result in "
        "Mode II too, where only Mode III reads it, so at 32 children the model's Mode II slot is the wider. "
        "Mode III adds the word of `ResultAcks` per slot: the result's PSN again, the bitmap of children that "
        "ACKed it, and a 32-bit completion stamp for the timers (the model's timers are event times).",
        "- **Per child.** A job's PSN tables have an entry for each of the 64 worker numbers a QPN can name "
        "(`QPN_WORKER_BITS`), whether or not the job has that many children: the address is (job, worker), "
        "with no indirection. Each child's next result PSN sits in the worker table twice, so that the "
        "emitters and the reflectors read it in the same cycle, and the expected PSN's entry carries Mode III's "
        "NAK-sent bit in a Mode III build.",
        "- **Per job.** The RTL's few per-job values (Mode III's next result PSN, children, region) are "
        "registers, not block RAM, and are not in the RTL columns.",
        "",
        f"## The memories of the Mode III build, K = {CHILDREN[0]}",
        "",
        "| memory | entry bits | entries | indexed by | modes | holds |",
        "|---|---:|---:|---|---|---|",
        *listing,
        "",
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())

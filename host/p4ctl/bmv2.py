"""``simple_switch_CLI`` commands that configure ``p4/v1model/inagg.p4`` on BMv2.

:func:`commands` configures a freshly started ``simple_switch``
(``simple_switch_CLI < commands.txt``): multicast node handles are numbered
from 0 in creation order, which holds for a switch that has no multicast
nodes yet. The slot registers are reset, so the same commands also restart
a running switch, every job at once.

:class:`Switch` changes one job on a running switch and leaves the others
alone: it keeps what it installed and the handles the switch answered, so it
can delete a job's entries and nodes and wipe its registers
(``docs/protocol.md`` 3.2, a new incarnation). It does no I/O: feed its
commands to ``simple_switch_CLI`` and hand the answer to
:meth:`Switch.answered`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from inagg.host.p4ctl.layout import Plan
from inagg.models.job import SwitchSpec

__all__ = ["commands", "Switch", "slot_registers", "SLOT_REGISTERS", "WORKER_REGISTERS"]

# Registers of the slot memory: each has entries per slot (1, or one per lane), cleared so that slots start FREE.
SLOT_REGISTERS = ("InaggIngress.slot_state", "InaggIngress.slot_chunk", "InaggIngress.slot_bitmap",
                  "InaggIngress.slot_count", "InaggIngress.slot_first", "InaggIngress.lanes")
# Registers with one entry per (job, worker), at layout.psn_index: the plan's psns.
WORKER_REGISTERS = ("InaggEgress.result_psn",)


def slot_registers(spec: SwitchSpec) -> dict[str, int]:
    """Entries per slot of each slot register for switch ``spec``: slot ``s`` owns ``s * n .. s * n + n - 1``."""
    return {r: spec.lanes if r == "InaggIngress.lanes" else 1 for r in SLOT_REGISTERS}


def _check(p: Plan) -> None:
    if p.target.name != "v1model":
        raise ValueError(f"simple_switch_CLI commands are for the v1model program, not {p.target.name}")


def _worker_entry(w) -> tuple[str, str, str]:
    return ("InaggIngress.workers", f"0x{w.qpn:06x}",
            f"InaggIngress.set_worker 0x{w.qpn:06x} => {w.job} {w.worker} 0x{w.rkey:08x} {w.slot_base} "
            f"{w.slot_mask} {w.nworkers} {w.port}")


def _result_entry(r) -> tuple[str, str, str]:
    return ("InaggEgress.results", f"{r.job} {r.worker}",
            f"InaggEgress.rewrite {r.job} {r.worker} => 0x{r.mac:012x} 0x{r.ip:08x} 0x{r.qpn:06x} "
            f"0x{r.rkey:08x} 0x{r.result_va:016x}")


def _entries(p: Plan) -> list[tuple[str, str, str]]:
    """(table, key, the rest of its table_add) of every table entry of ``p``."""
    return [_worker_entry(w) for w in p.workers] + [_result_entry(r) for r in p.results]


def _add(p: Plan, handles: Iterator[int], nodes: dict[tuple[int, int], int]) -> list[str]:
    """Commands that write every job of ``p``; the nodes take ``handles`` in turn, recorded in ``nodes``."""
    out = [f"table_add {table} {rest}" for table, _, rest in _entries(p)]
    for g in p.groups:
        out.append(f"mc_mgrp_create {g.group}")
        for rid, port in g.nodes:
            handle = next(handles)
            nodes[g.job, rid] = handle
            out.append(f"mc_node_create {rid} {port}")
            out.append(f"mc_node_associate {g.group} {handle}")
    out += [f"register_write InaggEgress.result_psn {e.index} {e.psn}" for e in p.psns]
    return out


def _switch_config(p: Plan) -> str:
    return (f"table_set_default InaggIngress.switch_config InaggIngress.set_switch "
            f"0x{p.spec.pkey:04x} 0x{p.switch_mac:012x} 0x{p.switch_ip:08x}")


def commands(p: Plan) -> list[str]:
    """The CLI commands for plan ``p`` (one string per line), for the v1model target."""
    return Switch(p).configure()


# What simple_switch_CLI prints for a table_add and an mc_node_create (bmv2's tools/runtime_CLI.py); not anchored
# at the line's start, where the "RuntimeCmd: " prompt, printed without a newline, may stand.
_ENTRY_HANDLE = re.compile(r"Entry has been added with handle (\d+)$", re.M)
_NODE_HANDLE = re.compile(r"node was created with handle (\d+)$", re.M)


class Switch:
    """What this control plane installed on one running ``simple_switch``, and the commands that change it.

    Parameters
    ----------
    p:
        The plan of the jobs the switch holds; :meth:`configure` writes it on
        a freshly started switch.

    Table entries are deleted by the handle the switch answered when it added
    them (BMv2 deletes by handle only, and a handle carries a version the
    switch chose), so every batch of :meth:`configure` and :meth:`add` must
    be followed by :meth:`answered` with what ``simple_switch_CLI`` printed
    for it. Multicast node handles are the lowest free ones, which is how
    BMv2 hands them out; :meth:`answered` checks each.
    """

    def __init__(self, p: Plan):
        _check(p)
        self.plan = p
        self._entries: dict[tuple[str, str], int | None] = {}   # (table, key) -> entry handle once answered
        self._nodes: dict[tuple[int, int], int] = {}           # (job, replication id) -> node handle

    def configure(self) -> list[str]:
        """Commands for a freshly started switch: every slot register reset, then the plan's switch and jobs."""
        self._entries.clear()
        self._nodes.clear()
        out = [f"register_reset {r}" for r in SLOT_REGISTERS]
        out.append(_switch_config(self.plan))
        return out + self._add(self.plan)

    def add(self, p: Plan, job: int) -> list[str]:
        """Commands that add job ``job`` of plan ``p``; ``p`` is the switch's jobs with it (:func:`~.layout.plan`
        checked their regions). The job's region must be FREE: on a running switch, a torn-down job's."""
        _check(p)
        if any(e.job == job for e in self.plan.regions):
            raise ValueError(f"job {job} is on the switch already: remove it first")
        if p.without(job) != self.plan:
            raise ValueError(f"the plan must hold the switch's jobs and job {job}, nothing else changed")
        self.plan = p
        return self._add(p.only(job))

    def _add(self, part: Plan) -> list[str]:
        used = set(self._nodes.values())
        free = (h for h in range(len(used) + len(part.workers)) if h not in used)
        for table, key, _ in _entries(part):
            self._entries[table, key] = None
        return _add(part, free, self._nodes)

    def remove(self, job: int) -> list[str]:
        """Commands that tear job ``job`` down and leave every other job as it is.

        Every entry the plan holds for the job goes: its ``workers`` and
        ``results`` entries, its multicast nodes and group, its
        ``result_psn`` entries (back to 0, as on a fresh switch), and every
        entry of every slot register in its region (FREE, first bit clear,
        lanes zero), so that nothing of this incarnation reaches the next one.
        """
        part = self.plan.only(job)
        out = []
        for table, key, _ in _entries(part):
            handle = self._entries.pop((table, key))
            if handle is None:
                raise ValueError(f"no handle for {table} {key}: pass the switch's answer to answered() first")
            out.append(f"table_delete {table} {handle}")
        for g in part.groups:
            for rid, _ in g.nodes:
                handle = self._nodes.pop((job, rid))
                out.append(f"mc_node_dissociate {g.group} {handle}")
                out.append(f"mc_node_destroy {handle}")
            out.append(f"mc_mgrp_destroy {g.group}")
        out += [f"register_write {r} {e.index} 0" for r in WORKER_REGISTERS for e in part.psns]
        for reg, n in slot_registers(part.spec).items():
            out += [f"register_write {reg} {i} 0" for region in part.regions
                    for i in range(region.base * n, (region.base + region.slots) * n)]
        self.plan = self.plan.without(job)
        return out

    def answered(self, cmds: list[str], output: str) -> None:
        """Record the handles in ``output``, what ``simple_switch_CLI`` printed for the batch ``cmds``.

        Raises RuntimeError when the answer does not give one handle per
        added entry and node, or a node handle is not the one its
        ``mc_node_associate`` used.
        """
        adds = [c.split()[1:] for c in cmds if c.startswith("table_add ")]
        entries = [int(h) for h in _ENTRY_HANDLE.findall(output)]
        creates = [i for i, c in enumerate(cmds) if c.startswith("mc_node_create ")]
        nodes = [int(h) for h in _NODE_HANDLE.findall(output)]
        if len(entries) != len(adds) or len(nodes) != len(creates):
            raise RuntimeError(f"simple_switch_CLI gave {len(entries)} entry handles for {len(adds)} table_add and "
                               f"{len(nodes)} node handles for {len(creates)} mc_node_create:\n{output}")
        for args, handle in zip(adds, entries):
            table, rest = args[0], " ".join(args[2:])
            self._entries[table, rest.split(" => ")[0]] = handle
        for i, handle in zip(creates, nodes):
            used = int(cmds[i + 1].split()[2])
            if handle != used:
                raise RuntimeError(f"simple_switch gave node handle {handle} where {cmds[i + 1]!r} expected {used}")

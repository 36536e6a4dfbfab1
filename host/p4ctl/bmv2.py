"""``simple_switch_CLI`` commands that configure ``p4/v1model/inagg.p4`` on BMv2.

Feed the output to a freshly started ``simple_switch`` (``simple_switch_CLI <
commands.txt``): multicast node handles are numbered from 0 in creation
order, which holds for a switch that has no multicast nodes yet. The slot
registers are reset, so the same commands also restart a running switch.
"""

from __future__ import annotations

from inagg.host.p4ctl.layout import Plan

__all__ = ["commands", "SLOT_REGISTERS"]

# Registers of the slot memory, cleared so that every slot starts FREE.
SLOT_REGISTERS = ("InaggIngress.slot_state", "InaggIngress.slot_chunk", "InaggIngress.slot_bitmap",
                  "InaggIngress.slot_count", "InaggIngress.slot_first", "InaggIngress.lanes")


def commands(p: Plan) -> list[str]:
    """The CLI commands for plan ``p`` (one string per line), for the v1model target."""
    if p.target.name != "v1model":
        raise ValueError(f"simple_switch_CLI commands are for the v1model program, not {p.target.name}")
    out = [f"register_reset {r}" for r in SLOT_REGISTERS]
    out.append(f"table_set_default InaggIngress.switch_config InaggIngress.set_switch "
               f"0x{p.spec.pkey:04x} 0x{p.switch_mac:012x} 0x{p.switch_ip:08x}")
    for w in p.workers:
        out.append(f"table_add InaggIngress.workers InaggIngress.set_worker 0x{w.qpn:06x} => "
                   f"{w.job} {w.worker} 0x{w.rkey:08x} {w.slot_base} {w.slot_mask} {w.nworkers} {w.port}")
    for r in p.results:
        out.append(f"table_add InaggEgress.results InaggEgress.rewrite {r.job} {r.worker} => "
                   f"0x{r.mac:012x} 0x{r.ip:08x} 0x{r.qpn:06x} 0x{r.rkey:08x} 0x{r.result_va:016x}")
    handle = 0
    for g in p.groups:
        out.append(f"mc_mgrp_create {g.group}")
        for rid, port in g.nodes:
            out.append(f"mc_node_create {rid} {port}")
            out.append(f"mc_node_associate {g.group} {handle}")
            handle += 1
    out += [f"register_write InaggEgress.result_psn {i} {psn}" for i, psn in p.psns]
    return out

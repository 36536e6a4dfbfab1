"""scapy layers for the RoCEv2 headers the protocol uses beyond ``scapy.contrib.roce``.

``scapy.contrib.roce`` has the BTH (with the ICRC as its trailing field,
computed as :mod:`inagg.models.icrc` does) and the AETH. This module adds the
RETH and the ImmDt and binds them per opcode, so that::

    Ether() / IP(flags="DF") / UDP(dport=4791, chksum=0) / BTH(opcode=0x2B, ...) / RETH(...) / ImmDt(...) / Raw(payload)

builds, and parses back from bytes, with UDP checksum 0 and a correct ICRC.
The RETH and ImmDt fields are generated from :mod:`inagg.models.frame`;
``tests/host/test_roce.py`` checks scapy's BTH and AETH against it field by
field.
:func:`contribution` and :func:`result` build the two frames of
``docs/protocol.md`` from a job description, field for field as
:func:`inagg.models.wire.build` does.

Importing this module imports scapy; the data path uses
:mod:`inagg.host.fastpath` instead.
"""

from __future__ import annotations

from scapy.contrib.roce import AETH, BTH
from scapy.fields import BitField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers

from inagg.models import frame
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import CHUNK_MOD, IMM_OPCODES, RETH_OPCODES, encode_imm, qp_udp_sport

__all__ = ["BTH", "RETH", "ImmDt", "AETH", "contribution", "result", "SCAPY_NAMES"]

SCAPY_NAMES = {"reth": {"dma_len": "dlen"}}
"""Field names of the scapy layers that differ from :mod:`inagg.models.frame`'s, per header."""


def _fields_desc(header: frame.Header) -> list:
    """A scapy ``fields_desc`` for ``header``, field for field."""
    names = SCAPY_NAMES.get(header.name, {})
    return [BitField(names.get(f.name, f.name), f.value or 0, f.bits) for f in header.fields]


class RETH(Packet):
    """RDMA extended transport header: virtual address, R_Key, DMA length."""

    name = "RETH"
    fields_desc = _fields_desc(frame.RETH)

    def guess_payload_class(self, payload: bytes):
        bth = self.underlayer
        if isinstance(bth, BTH) and bth.opcode in IMM_OPCODES:
            return ImmDt
        return Raw


class ImmDt(Packet):
    """Immediate data: in a result, the FP32 and SATURATED bits and the chunk's low 30 bits."""

    name = "ImmDt"
    fields_desc = _fields_desc(frame.IMMDT)

    def guess_payload_class(self, payload: bytes):
        return Raw


for _op in sorted(RETH_OPCODES):
    bind_layers(BTH, RETH, opcode=int(_op))


def _stack(eth_dst: str, eth_src: str, ip_src: str, ip_dst: str, sport: int) -> Packet:
    # The fixed values of inagg.models.frame, as wire.build sends them.
    ip = frame.IPV4
    return (Ether(dst=eth_dst, src=eth_src)
            / IP(src=ip_src, dst=ip_dst, flags="DF" if ip["flag_df"].value else 0, id=ip["identification"].value,
                 ttl=ip["ttl"].value, tos=ip["tos"].value)
            / UDP(sport=sport, dport=frame.UDP["dport"].value, chksum=frame.UDP["checksum"].value))


def contribution(switch: SwitchSpec, job: JobSpec, rank: int, chunk: int, payload: bytes) -> Packet:
    """The contribution of worker ``rank`` of ``job`` for chunk sequence ``chunk`` (PSN: its low 24 bits)."""
    me = job.workers[rank]
    return (_stack(switch.mac, me.mac, me.ip, switch.ip, qp_udp_sport(me.qpn))
            / BTH(opcode=int(frame.CONTRIBUTION.opcode), migreq=frame.BTH["migreq"].value, pkey=switch.pkey,
                  dqpn=job.qpn(rank), psn=chunk & 0xFFFFFF)
            / RETH(va=(chunk % CHUNK_MOD) * switch.chunk_bytes, rkey=job.contrib_rkey(rank), dlen=len(payload)) / Raw(payload))


def result(switch: SwitchSpec, job: JobSpec, rank: int, chunk: int, payload: bytes, *, fp32: bool = False,
           psn: int = 0) -> Packet:
    """The result the switch sends worker ``rank`` of ``job`` for chunk sequence ``chunk``."""
    me = job.workers[rank]
    return (_stack(me.mac, switch.mac, switch.ip, me.ip, qp_udp_sport(me.qpn))
            / BTH(opcode=int(frame.RESULT.opcode), migreq=frame.BTH["migreq"].value, pkey=switch.pkey, dqpn=me.qpn,
                  psn=psn)
            / RETH(va=me.result_va + (chunk % job.slots) * switch.chunk_bytes, rkey=me.rkey, dlen=len(payload))
            / ImmDt(imm=encode_imm(chunk, fp32)) / Raw(payload))

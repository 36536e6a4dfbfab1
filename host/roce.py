"""scapy layers for the RoCEv2 headers the protocol uses beyond ``scapy.contrib.roce``.

``scapy.contrib.roce`` has the BTH (with the ICRC as its trailing field,
computed as :mod:`inagg.models.icrc` does) and the AETH. This module adds the
RETH and the ImmDt and binds them per opcode, so that::

    Ether() / IP(flags="DF") / UDP(dport=4791, chksum=0) / BTH(opcode=0x2B, ...) / RETH(...) / ImmDt(...) / Raw(payload)

builds, and parses back from bytes, with UDP checksum 0 and a correct ICRC.
:func:`contribution` and :func:`result` build the two frames of
``docs/protocol.md`` from a job description, field for field as
:func:`inagg.models.wire.build` does.

Importing this module imports scapy; the data path uses
:mod:`inagg.host.fastpath` instead.
"""

from __future__ import annotations

from scapy.contrib.roce import AETH, BTH
from scapy.fields import IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers

from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import (
    DEFAULT_TTL, ROCE_UDP_PORT, Opcode, encode_imm, result_udp_sport,
)

from inagg.host.fastpath import worker_udp_sport

__all__ = ["BTH", "RETH", "ImmDt", "AETH", "contribution", "result"]


class RETH(Packet):
    """RDMA extended transport header: virtual address, R_Key, DMA length."""

    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dlen", 0)]

    def guess_payload_class(self, payload: bytes):
        bth = self.underlayer
        if isinstance(bth, BTH) and bth.opcode in (Opcode.UC_RDMA_WRITE_ONLY_IMM, Opcode.RC_RDMA_WRITE_ONLY_IMM):
            return ImmDt
        return Raw


class ImmDt(Packet):
    """Immediate data: in a result, the FP32 and SATURATED bits and the chunk's low 30 bits."""

    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]

    def guess_payload_class(self, payload: bytes):
        return Raw


for _op in (Opcode.UC_RDMA_WRITE_ONLY, Opcode.UC_RDMA_WRITE_ONLY_IMM,
            Opcode.RC_RDMA_WRITE_ONLY, Opcode.RC_RDMA_WRITE_ONLY_IMM):
    bind_layers(BTH, RETH, opcode=int(_op))


def _stack(eth_dst: str, eth_src: str, ip_src: str, ip_dst: str, sport: int) -> Packet:
    # wire.build's choices: DF set, identification 0, TTL 64, TOS 0, UDP checksum 0.
    return (Ether(dst=eth_dst, src=eth_src) / IP(src=ip_src, dst=ip_dst, flags="DF", id=0, ttl=DEFAULT_TTL, tos=0)
            / UDP(sport=sport, dport=ROCE_UDP_PORT, chksum=0))


def contribution(switch: SwitchSpec, job: JobSpec, rank: int, chunk: int, payload: bytes) -> Packet:
    """The contribution of worker ``rank`` of ``job`` for chunk sequence ``chunk`` (PSN: its low 24 bits)."""
    me = job.workers[rank]
    return (_stack(switch.mac, me.mac, me.ip, switch.ip, worker_udp_sport(me.qpn))
            / BTH(opcode=int(Opcode.UC_RDMA_WRITE_ONLY), migreq=1, pkey=switch.pkey, dqpn=job.qpn(rank),
                  psn=chunk & 0xFFFFFF)
            / RETH(va=(chunk % 2**32) * switch.chunk_bytes, rkey=job.rkey, dlen=len(payload)) / Raw(payload))


def result(switch: SwitchSpec, job: JobSpec, rank: int, chunk: int, payload: bytes, *, fp32: bool = False,
           psn: int = 0) -> Packet:
    """The result the switch sends worker ``rank`` of ``job`` for chunk sequence ``chunk``."""
    me = job.workers[rank]
    return (_stack(me.mac, switch.mac, switch.ip, me.ip, result_udp_sport(me.qpn))
            / BTH(opcode=int(Opcode.UC_RDMA_WRITE_ONLY_IMM), migreq=1, pkey=switch.pkey, dqpn=me.qpn, psn=psn)
            / RETH(va=me.result_va + (chunk % job.slots) * switch.chunk_bytes, rkey=me.rkey, dlen=len(payload))
            / ImmDt(imm=encode_imm(chunk, fp32)) / Raw(payload))

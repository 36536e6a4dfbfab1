"""scapy layers: build and parse round-trip, ICRC and UDP checksum as the protocol says, same bytes as the fast path."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from scapy.contrib.roce import AETH
from scapy.layers.inet import UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from inagg.host.controller import plan
from inagg.host.fastpath import ContribTemplate, ResultParser
from inagg.host.roce import BTH, RETH, SCAPY_NAMES, ImmDt, contribution, result
from inagg.models import frame, icrc, wire
from inagg.models.protocol import Opcode
from inagg.models.switch import ModelSwitch

PLAN = plan([2], window=8)
SW, JOB = PLAN.switch, PLAN.jobs[0]


@given(rank=st.integers(0, 1), chunk=st.integers(0, 2**32 - 1),
       lanes=st.lists(st.integers(-2**31, 2**31 - 1), min_size=SW.lanes, max_size=SW.lanes))
def test_scapy_contribution_is_the_fast_path_frame(rank, chunk, lanes):
    lanes = np.array(lanes, np.int32)
    fast = ContribTemplate(SW, JOB, rank).build(np.array([chunk]), lanes[None])[0].tobytes()
    assert bytes(contribution(SW, JOB, rank, chunk, lanes.astype(">i4").tobytes())) == fast


@given(rank=st.integers(0, 1), chunk=st.integers(0, 2**32 - 1), fp32=st.booleans(), psn=st.integers(0, 2**24 - 1))
def test_scapy_result_parses_back_and_checks(rank, chunk, fp32, psn):
    payload = np.arange(SW.lanes, dtype=">u4").tobytes()
    frame = bytes(result(SW, JOB, rank, chunk, payload, fp32=fp32, psn=psn))
    assert icrc.check(frame)
    p = Ether(frame)
    assert p[UDP].chksum == 0 and p[UDP].dport == 4791
    assert p[BTH].opcode == Opcode.UC_RDMA_WRITE_ONLY_IMM and p[BTH].psn == psn
    assert p[RETH].dlen == SW.chunk_bytes and p[RETH].rkey == JOB.workers[rank].rkey
    assert p[ImmDt].imm == (chunk & (2**30 - 1)) | (fp32 << 31)
    assert p[Raw].load == payload
    assert bytes(p) == frame
    r = ResultParser(SW, JOB, rank).parse(frame)
    assert (r.chunk30, r.fp32, r.psn) == (chunk & (2**30 - 1), fp32, psn)


def test_model_switch_results_dissect_with_scapy():
    sw = ModelSwitch(SW)
    sw.add_job(JOB)
    out = []
    for rank in range(2):
        out += sw.receive(rank, bytes(contribution(SW, JOB, rank, 3, bytes(SW.chunk_bytes))))
    p = Ether(out[1][1])
    assert p[BTH].dqpn == JOB.workers[1].qpn and p[ImmDt].imm == 3
    assert p[RETH].va == JOB.workers[1].result_va + 3 * SW.chunk_bytes
    assert bytes(p) == out[1][1]


def test_contribution_without_immediate_has_no_immdt():
    p = Ether(bytes(contribution(SW, JOB, 0, 9, bytes(SW.chunk_bytes))))
    assert RETH in p and ImmDt not in p and len(p[Raw].load) == SW.chunk_bytes
    assert wire.parse(bytes(p)).va == 9 * SW.chunk_bytes


# scapy.contrib.roce's names for the fields of models.frame, and the one field it splits in three.
_SCAPY_BTH_NAMES = {"se": ("solicited",), "pad": ("padcount",), "tver": ("version",),
                    "resv8a": ("fecn", "becn", "resv6")}


def _scapy_bits(layer) -> dict[str, int]:
    return {f.name: getattr(f, "size", None) or 8 * f.sz for f in layer.fields_desc}


def test_scapy_layers_have_the_described_fields():
    for layer, header, names in ((BTH, frame.BTH, _SCAPY_BTH_NAMES), (AETH, frame.AETH, {}),
                                 (RETH, frame.RETH, {}), (ImmDt, frame.IMMDT, {})):
        bits = _scapy_bits(layer)
        order = [f.name for f in layer.fields_desc]
        expected = []
        for f in header.fields:
            group = names.get(f.name) or (SCAPY_NAMES.get(header.name, {}).get(f.name, f.name),)
            assert sum(bits[g] for g in group) == f.bits, f"{header.name}.{f.name}"
            expected += group
        # scapy's BTH ends with the ICRC, which the description keeps out of the header.
        assert order[:len(expected)] == expected and order[len(expected):] in ([], ["icrc"]), header.name

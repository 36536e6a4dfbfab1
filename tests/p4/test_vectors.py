"""The stored PTF-style vectors are what the P4 profile model produces, and they are self-consistent."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from scapy.utils import rdpcap

from inagg.host.p4ctl import vectors
from inagg.models import wire
from inagg.models.p4profile import TARGETS
from inagg.models.protocol import Counter, decode_imm

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "p4" / "tests" / "vectors"


def test_generator_reproduces_the_stored_files(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_vectors", ROOT / "p4" / "tests" / "gen_vectors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(p.name for p in STORED.iterdir())
    for name in names:
        assert (tmp_path / name).read_bytes() == (STORED / name).read_bytes(), f"{name} is stale: run p4/tests/gen_vectors.py"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_vectors_are_consistent(target):
    meta = json.loads((STORED / f"{target}.json").read_text())
    ins = [bytes(p) for p in rdpcap(str(STORED / f"{target}_in.pcap"))]
    outs = [bytes(p) for p in rdpcap(str(STORED / f"{target}_out.pcap"))]
    assert len(ins) == len(meta["cases"]) and len(outs) == sum(len(c["out"]) for c in meta["cases"])
    assert meta["counters"]["RX_FRAMES"] == len(ins)
    assert meta["counters"]["TX_RESULTS"] == len(outs)
    saturated = 0
    for o in outs:
        r = wire.parse(o) if TARGETS[target].checks_icrc else wire.parse(o[:-4] + _icrc(o[:-4]))
        assert not isinstance(r, Counter), r
        saturated += decode_imm(r.imm)[2]
    assert saturated == 3  # the saturating chunk's two results and its resend
    # Every drop counter the target can see has a case.
    drops = {c.name for c in Counter if c.name.startswith("DROP_") and meta["counters"][c.name]}
    expected = {"DROP_NON_ROCE", "DROP_BAD_HEADER", "DROP_BAD_LENGTH", "DROP_BAD_OPCODE", "DROP_UNKNOWN_QPN",
                "DROP_BAD_RKEY", "DROP_BAD_ADDRESS", "DROP_STALE", "DROP_WINDOW"}
    assert drops == expected | ({"DROP_BAD_ICRC"} if TARGETS[target].checks_icrc else set())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_vectors_cover_port_binding_and_liveness(target):
    """Issue 21 on the P4 programs: a worker's QPN on another port is dropped, a stray chunk on a FREE slot
    gives way to the job's own, which completes (once it has, the stray is dropped), and a worker with an R_Key
    of its own is refused with the job's."""
    meta = json.loads((STORED / f"{target}.json").read_text())
    cases = {c["name"]: c for c in meta["cases"]}
    wrong = cases["worker 1's QPN on worker 0's port"]
    assert wrong["out"] == [] and wrong["port"] != meta["jobs"][0]["workers"][1]["port"]
    assert cases["job1 stray chunk 2**30+3 worker2: takes FREE slot 3"]["out"] == []
    assert cases["job1 chunk3 worker0: restarts the stray's slot"]["out"] == []
    assert len(cases["job1 chunk3 worker2"]["out"]) == 3
    assert cases["job1 stray chunk 2**30+3 worker2 again: window"]["out"] == []
    # Job 2's workers carry R_Keys of their own: the job's key is refused, and their own completed job 2's chunks.
    assert all(w["contrib_rkey"] is not None for w in meta["jobs"][1]["workers"])
    assert cases["job 2 worker 0 with the job's R_Key, not its own"]["out"] == []
    assert meta["counters"]["DROP_BAD_RKEY"] == 2


def _icrc(frame: bytes) -> bytes:
    from inagg.models.icrc import icrc
    return icrc(frame)


def test_scenario_is_deterministic():
    a, b = vectors.scenario(TARGETS["tna"]), vectors.scenario(TARGETS["tna"])
    assert [(c.port, c.frame, c.out) for c in a.cases] == [(c.port, c.frame, c.out) for c in b.cases]


def test_the_scenario_at_another_chunk_size():
    stored = json.loads((STORED / "v1model.json").read_text())
    v = vectors.scenario(TARGETS["v1model"], 256)
    assert v.spec.chunk_bytes == 256 and [c.name for c in v.cases] == [c["name"] for c in stored["cases"]]
    assert {k: n for k, n in v.counters.items()} == stored["counters"]
    with pytest.raises(ValueError, match=r"the tna program is built for chunk_bytes in \(256,\), not 1024"):
        vectors.switch_for(TARGETS["tna"], 1024)

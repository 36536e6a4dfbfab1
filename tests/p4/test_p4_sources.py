"""The P4 sources: constants agree with the models, and they compile where a P4 compiler is installed."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from inagg.models import frame, protocol
from inagg.models.protocol import Counter, Opcode
from inagg.models.switch import SlotState

ROOT = Path(__file__).resolve().parents[2]
COMMON = (ROOT / "p4" / "common" / "protocol.p4").read_text()


def p4_const(name: str) -> int:
    m = re.search(rf"const bit<\d+>\s+{name}\s*=\s*(0x[0-9A-Fa-f]+|\d+);", COMMON)
    assert m, f"{name} is not declared in p4/common/protocol.p4"
    return int(m.group(1), 0)


def test_constants_match_the_protocol_model():
    assert p4_const("ETHERTYPE_IPV4") == protocol.ETH_TYPE_IPV4
    assert p4_const("IP_PROTO_UDP") == protocol.IP_PROTO_UDP
    assert p4_const("ROCE_UDP_PORT") == protocol.ROCE_UDP_PORT
    assert p4_const("QPN_PREFIX") == protocol.QPN_PREFIX
    assert p4_const("OP_RC_WRITE_ONLY") == Opcode.RC_RDMA_WRITE_ONLY
    assert p4_const("OP_RC_WRITE_ONLY_IMM") == Opcode.RC_RDMA_WRITE_ONLY_IMM
    assert p4_const("OP_UC_WRITE_ONLY") == Opcode.UC_RDMA_WRITE_ONLY
    assert p4_const("OP_UC_WRITE_ONLY_IMM") == Opcode.UC_RDMA_WRITE_ONLY_IMM
    assert p4_const("IMM_SATURATED") == protocol.IMM_SATURATED
    assert p4_const("IMM_CHUNK_MASK") == protocol.IMM_CHUNK_MASK
    assert p4_const("RESULT_TTL") == protocol.DEFAULT_TTL
    assert p4_const("QP_SPORT_BASE") == protocol.qp_udp_sport(0)
    assert p4_const("QP_SPORT_BASE") == protocol.QP_SPORT_BASE
    for n in ("IPV4", "UDP", "BTH", "RETH", "IMMDT", "ICRC"):
        assert p4_const(f"{n}_LEN") == getattr(protocol, f"{n}_LEN")


def p4_headers() -> dict[str, list[tuple[str, int]]]:
    """Every ``header <name>_h { bit<n> field; ... }`` of p4/common/protocol.p4, fields in order."""
    out = {}
    for name, body in re.findall(r"header\s+(\w+)_h\s*\{([^}]*)\}", COMMON):
        out[name] = [(f, int(n)) for n, f in re.findall(r"bit<(\d+)>\s+(\w+)\s*;", body)]
    return out


@pytest.mark.parametrize("header", ["ethernet", "ipv4", "udp", "bth", "reth", "immdt"])
def test_headers_match_the_frame_description(header):
    assert p4_headers()[header] == [(f.name, f.bits) for f in frame.HEADERS[header].fields]


def test_icrc_macro_masks_the_described_fields():
    m = re.search(r"#define INAGG_ICRC_HEADERS\(h\)(.*?)\n\n", COMMON, re.S)
    assert m, "INAGG_ICRC_HEADERS is not defined in p4/common/protocol.p4"
    items = [t.strip() for t in m.group(1).replace("\\", " ").split(",")]
    expected = ["64w0x" + "F" * 16]
    for h in (frame.IPV4, frame.UDP, frame.BTH, frame.RETH):
        expected += [f"{f.bits}w0x" + "F" * (f.bits // 4) if f.icrc_ones else f"h.{h.name}.{f.name}"
                     for f in h.fields]
    assert [t.upper() for t in items] == [t.upper() for t in expected]


def test_counter_indices_are_the_register_order():
    for c in Counter:
        assert p4_const(f"CNT_{c.name}") == c.value
    assert p4_const("N_COUNTERS") == len(Counter)
    for s in SlotState:
        assert p4_const(f"SLOT_{s.name}") == s.value


def _check_module():
    spec = importlib.util.spec_from_file_location("inagg_p4_check", ROOT / "p4" / "check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


CHECK = _check_module()
CHECKS = CHECK.checks(lanes=(64,))  # make p4-check runs the 256-lane builds too


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_p4_compiles(check):
    if check.argv is None:
        pytest.skip(check.skip)
    result = CHECK.run(check)
    if check.known:
        assert not result.ok, f"{check.name} compiles now: drop its known failure ({check.known})"
        assert check.known in result.output, result.detail
        pytest.xfail(f"the tool fails in {check.known}: {result.detail}")
    assert result.ok, result.detail


def test_a_check_fails_when_its_second_command_fails():
    """The Tofino checks pass only once the assembler takes the compiler's output (``Check.then``)."""
    passes = CHECK.run(CHECK.Check("both", ("true",), then=("sh", "-c", "test -d {out}/bin/logs && test -d bin")))
    assert passes.ok, passes.detail
    assert " && sh -c " in passes.detail
    warned = CHECK.run(CHECK.Check("warnings", ("echo", "x.p4(1): warning: a"), then=("echo", "warning: b")))
    assert warned.ok and warned.detail.endswith("(2 warnings)"), warned.detail
    fails = CHECK.run(CHECK.Check("assembler refuses", ("true",), then=("sh", "-c", "echo 'error: 14 stages'; exit 1")))
    assert not fails.ok and fails.detail == "error: 14 stages"
    # a failing compiler never reaches the assembler
    first = CHECK.run(CHECK.Check("compiler refuses", ("sh", "-c", "echo 'error: first'; exit 1"), then=("true",)))
    assert not first.ok and first.detail == "error: first"


def test_the_tofino_checks_assemble_with_the_bfas_beside_the_compiler(tmp_path, monkeypatch):
    compiler, assembler = tmp_path / "p4c-barefoot", tmp_path / "bfas"
    for tool in (compiler, assembler):
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    monkeypatch.setenv("P4C_BAREFOOT", str(compiler))
    monkeypatch.delenv("BFAS", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    tofino = [c for c in CHECK.checks(lanes=(64,)) if c.name.startswith("p4c-barefoot")]
    assert [c.name for c in tofino] == ["p4c-barefoot tna + bfas", "p4c-barefoot t2na + bfas"]
    assert all(c.then[:2] == (str(assembler), "{out}/pipe/inagg.bfa") for c in tofino)
    assembler.unlink()
    assert all(not c.then for c in CHECK.checks(lanes=(64,)) if c.name.startswith("p4c-barefoot"))

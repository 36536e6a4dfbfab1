"""``inagg demo``: options, summary, JSON, pcap, and a failing bound makes it exit 1."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from inagg import cli
from inagg.host import demo_run
from inagg.host.demo import parse_size
from inagg.models import icrc, wire
from inagg.models.protocol import Opcode


def run_cli(capsys, *argv):
    rc = cli.main(["demo", *argv])
    return rc, capsys.readouterr()


def test_demo_json_summary(capsys):
    rc, out = run_cli(capsys, "--size", "64KiB", "--workers", "3", "--jobs", "2", "--json")
    s = json.loads(out.out)
    assert rc == 0 and s["ok"] and s["workers"] == 3 and s["jobs"] == 2
    assert s["packets"]["contributions_sent"] == 6 * (64 + 2) and s["packets"]["retransmissions"] == 0
    assert 0 < s["max_error"] <= s["bound_at_max_error"]


def test_demo_under_faults_stays_within_bound(capsys):
    rc, out = run_cli(capsys, "--size", "32KiB", "--loss", "0.05", "--dup", "0.05", "--reorder", "0.1",
                      "--corrupt", "0.02", "--seed", "7", "--json")
    s = json.loads(out.out)
    assert rc == 0 and s["ok"]
    assert s["packets"]["retransmissions"] > 0 and s["drops"]["link"]["lost"] > 0
    assert s["drops"]["switch"].get("DROP_BAD_ICRC", 0) + s["drops"]["hosts"].get("DROP_BAD_ICRC", 0) > 0


def test_demo_table(capsys):
    rc, out = run_cli(capsys, "--size", "4KiB", "--workers", "2")
    assert rc == 0 and "PASS" in out.out and "max error" in out.out


def test_demo_fails_when_the_bound_is_missed(capsys, monkeypatch):
    monkeypatch.setattr(demo_run, "result_bound", lambda ref, *a: np.full_like(ref, 1e-30))
    rc, out = run_cli(capsys, "--size", "4KiB", "--workers", "2")
    assert rc == 1 and "FAIL" in out.out


def test_demo_pcap_frames_check(tmp_path, capsys):
    from scapy.utils import rdpcap

    path = tmp_path / "run.pcap"
    rc, _ = run_cli(capsys, "--size", "2KiB", "--workers", "2", "--pcap", str(path), "--json")
    frames = [bytes(p) for p in rdpcap(str(path))]
    assert rc == 0 and len(frames) == 2 * (2 + 2) * 2
    opcodes = {wire.parse(f).opcode for f in frames}
    assert opcodes == {Opcode.UC_RDMA_WRITE_ONLY, Opcode.UC_RDMA_WRITE_ONLY_IMM}
    assert all(icrc.check(f) for f in frames)


@pytest.mark.parametrize("argv, message", [
    (["--size", "3"], "size must be a multiple of 4 bytes"),
    (["--size", "lots"], "size must be a number of bytes with an optional unit"),
    (["--loss", "1.5"], r"a rate is a number in \[0, 1\), not '1.5'"),
    (["--workers", "0"], "expected a positive integer, not '0'"),
])
def test_demo_rejects_bad_options(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", *argv])
    assert e.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_demo_reports_bad_combinations(capsys):
    rc, out = run_cli(capsys, "--window", "3")
    assert rc == 2 and "window must be a power of two >= 1, not 3" in out.err


@pytest.mark.parametrize("text, n", [("16MiB", 16 << 20), ("4096", 4096), ("1 GB", 10**9), ("8KiB", 8192)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed (Debian: apt-get install tshark)")
def test_demo_pcap_decodes_as_roce_in_tshark(tmp_path, capsys):
    from scapy.utils import rdpcap

    path = tmp_path / "run.pcap"
    assert run_cli(capsys, "--size", "2KiB", "--workers", "2", "--pcap", str(path), "--json")[0] == 0
    fields = ["frame.protocols", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.reth.dmalen",
              "infiniband.invariant.crc"]
    out = subprocess.run(["tshark", "-r", str(path), "-T", "fields", *sum((["-e", f] for f in fields), [])],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split("\t") for line in out.splitlines()]
    frames = [bytes(p) for p in rdpcap(str(path))]
    assert len(rows) == len(frames) == 16
    for (protocols, opcode, qpn, dmalen, crc), frame in zip(rows, frames):
        assert protocols.startswith("eth:ethertype:ip:udp:infiniband")
        assert int(opcode) == frame[42] and int(opcode) in (0x2A, 0x2B)
        assert int(qpn, 16) == int.from_bytes(frame[47:50], "big")
        assert int(dmalen) == 1024
        assert int(crc, 16) == int.from_bytes(frame[-4:], "big") and icrc.check(frame)

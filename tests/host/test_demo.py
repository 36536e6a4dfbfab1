"""``inagg demo``: options, summary, JSON, pcap, and a failing bound makes it exit 1."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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
    assert s["switch"] == "fast" and s["switch_frames_per_s"] == s["packets"]["frames_to_switch"] / s["wall_time_s"]


def test_demo_under_faults_stays_within_bound(capsys):
    rc, out = run_cli(capsys, "--size", "32KiB", "--loss", "0.05", "--dup", "0.05", "--reorder", "0.1",
                      "--corrupt", "0.02", "--seed", "7", "--json")
    s = json.loads(out.out)
    assert rc == 0 and s["ok"]
    assert s["packets"]["retransmissions"] > 0 and s["drops"]["link"]["lost"] > 0
    assert s["drops"]["switch"].get("DROP_BAD_ICRC", 0) + s["drops"]["hosts"].get("DROP_BAD_ICRC", 0) > 0


def test_demo_table(capsys):
    rc, out = run_cli(capsys, "--size", "4KiB", "--workers", "2")
    assert rc == 0 and "PASS" in out.out and "max error" in out.out and "frames/s into the switch" in out.out


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


def test_demo_json_is_all_of_stdout():
    exe = Path(sys.executable).with_name("inagg")
    out = subprocess.run([str(exe), "demo", "--size", "4KiB", "--workers", "2", "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["ok"]


def test_demo_sends_what_a_build_prints_to_stderr(capfd, monkeypatch):
    # What the RTL backend's first run does: a child process (Verilator's build) and Python code print on fd 1.
    def noisy_run(cfg, progress):
        subprocess.run([sys.executable, "-c", "print('verilator build log')"], check=True)
        print("progress line")
        os.write(1, b"raw fd write\n")
        return {"ok": True}

    monkeypatch.setattr(demo_run, "run_demo", noisy_run)
    assert cli.main(["demo", "--size", "4KiB", "--json"]) == 0
    out = capfd.readouterr()
    assert json.loads(out.out) == {"ok": True}
    assert all(s in out.err for s in ("verilator build log", "progress line", "raw fd write"))


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


def test_demo_on_a_tree_under_faults(capsys):
    rc, out = run_cli(capsys, "--tree", "2x2", "--size", "16KiB", "--loss", "0.05", "--dup", "0.05", "--reorder",
                      "0.05", "--corrupt", "0.02", "--seed", "3", "--json")
    s = json.loads(out.out)
    assert rc == 0 and s["ok"] and s["workers"] == 4 and s["tree"]["switches"] == 3
    tree = s["tree"]["counters"]
    assert tree["UP_PARTIALS"] == tree["RX_PARENT"] == 2 * (16 + 2) and tree["UP_RESENDS"] > 0
    assert s["drops"]["link"]["lost"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--tree", "2x4", "--workers", "4"], "tree 2x4 has 8 ranks, not 4 workers"),
    (["--tree", "2x4", "--switch", "fast"], "--tree and --collective run on model switches"),
    (["--tree", "2x2", "--net", "netns", "--pcap", "x.pcap"], "--pcap captures one switch's ports in namespaces, "
                                                              "not a tree's"),
    (["--tree", "2x0"], r"tree spec '2x0': a switch has 1..64 children, not 0"),
])
def test_demo_refuses_bad_trees(capsys, argv, message):
    rc, out = run_cli(capsys, *argv)
    assert rc == 2 and re.search(message, out.err)


@pytest.mark.parametrize("collective", ["reduce", "broadcast", "barrier", "reduce-scatter", "allgather"])
@pytest.mark.parametrize("tree", [[], ["--tree", "2x2"]], ids=["switch", "tree"])
def test_demo_collectives_are_exact_under_faults(capsys, collective, tree):
    rc, out = run_cli(capsys, *tree, "--collective", collective, "--root", "2", "--size", "8KiB", "--loss", "0.05",
                      "--dup", "0.05", "--reorder", "0.05", "--seed", "4", "--json")
    s = json.loads(out.out)
    assert rc == 0 and s["ok"] and s["exact"] and s["collective"] == collective
    assert s["drops"]["link"].get("lost", 0) > 0 or collective == "barrier"  # a barrier sends one chunk per rank


def test_demo_collective_table_and_bad_root(capsys):
    rc, out = run_cli(capsys, "--collective", "broadcast", "--size", "4KiB", "--workers", "2")
    assert rc == 0 and "broadcast: every rank's result bit for bit as numpy's: PASS" in out.out
    rc, out = run_cli(capsys, "--collective", "reduce", "--root", "2", "--workers", "2")
    assert rc == 2 and "root must be a rank in 0..1, not 2" in out.err


@pytest.mark.parametrize("mode", ["I", "II", "III"])
def test_demo_rc_modes_on_a_tree_are_exact_under_loss(capsys, mode):
    rc, out = run_cli(capsys, "--tree", "2x4", "--mode", mode, "--size", "32KiB", "--loss", "0.02", "--dup", "0.02",
                      "--reorder", "0.02", "--seed", "3", "--json")
    s = json.loads(out.out)
    assert rc == 0 and s["ok"] and s["mode"] == mode and s["tree"]["spec"] == "2x4"
    assert s["drops"]["link"]["lost"] > 0 and s["tree"]["counters"]["UP_PARTIALS"] > 0
    assert s["switch_counters"]["ACK_REFLECTED" if mode == "II" else "HOP_RESENDS"] > 0


@pytest.mark.parametrize("mode", ["uc", "I", "II", "III"])
def test_demo_tells_where_a_tree_repaired_its_losses(capsys, mode):
    rc, out = run_cli(capsys, "--tree", "2x2", "--mode", mode, "--size", "32KiB", "--loss", "0.03", "--seed", "4",
                      "--json")
    s = json.loads(out.out)
    rows = s["tree"]["repairs"]
    assert rc == 0 and s["ok"] and [r["hop"] for r in rows] == ["s0:0 - s1", "s0:1 - s2", "s1:0 - rank 0",
                                                                "s1:1 - rank 1", "s2:0 - rank 2", "s2:1 - rank 3"]
    assert sum(r["lost"] for r in rows) == s["drops"]["link"]["lost"] > 0
    hop, e2e = (sum(r[k] for r in rows) for k in ("repaired_on_hop", "repaired_end_to_end"))
    if mode == "I":    # every connection ends at the next switch: every resend is the hop's
        assert hop >= s["switch_counters"]["HOP_RESENDS"] > 0 and e2e == 0
    elif mode == "III":  # every hop ACKs, NAKs and times out on its own; the ranks' timers stay a backstop
        assert hop >= s["switch_counters"]["HOP_RESENDS"] > 0 and hop > e2e
    else:              # only the ranks' timers (or reflected NAKs) repair a loss, and the switches pass it on
        assert hop == s["switch_counters"]["HOP_RESENDS"] == 0 and e2e >= s["packets"]["retransmissions"] > 0


def test_demo_table_shows_where_losses_were_repaired(capsys):
    rc, out = run_cli(capsys, "--tree", "2x2", "--mode", "III", "--size", "8KiB", "--loss", "0.05", "--no-progress")
    assert rc == 0 and "where losses were repaired" in out.out
    cells = r"[ │]+(\d+)[ │]+(\d+)[ │]+(\d+)"
    assert re.search(r"s0:1 - s2" + cells, out.out)
    total = re.search("total" + cells, out.out)
    assert int(total[1]) > 0 and int(total[3]) > 0


@pytest.mark.parametrize("mode", ["uc", "II", "III"])
def test_demo_runs_several_jobs_on_a_tree_exactly(capsys, mode):
    rc, out = run_cli(capsys, "--tree", "2x2", "--jobs", "2", "--mode", mode, "--size", "8KiB", "--window", "4",
                      "--loss", "0.02", "--seed", "5", "--json")
    s = json.loads(out.out)
    assert rc == 0 and s["ok"] and s["exact"] and s["jobs"] == 2 and s["mode"] == mode
    assert sorted(s["exponents"]) == ["1", "2"] and s["tree"]["misaddressed"] == 0
    assert s["packets"]["results_placed"] >= 2 * 4 * (8 + (2 if mode == "uc" else 0))
    assert s["drops"]["link"]["lost"] > 0


@pytest.mark.parametrize("collective", ["reduce", "allgather"])
def test_demo_runs_several_jobs_of_a_collective_on_a_tree_exactly(capsys, collective):
    rc, out = run_cli(capsys, "--tree", "2x2", "--jobs", "3", "--collective", collective, "--root", "1",
                      "--size", "4KiB", "--window", "2", "--json")
    s = json.loads(out.out)
    assert rc == 0 and s["ok"] and s["exact"] and s["jobs"] == 3 and s["tree"]["misaddressed"] == 0


def test_demo_on_a_tree_fails_when_one_job_differs_from_numpy(capsys, monkeypatch):
    from inagg.host import collectives

    real = collectives.reference
    calls = []

    def second_job_off(*a, **kw):
        calls.append(1)
        out = real(*a, **kw)
        return [x + 1 for x in out] if len(calls) == 2 else out

    monkeypatch.setattr(collectives, "reference", second_job_off)
    rc, out = run_cli(capsys, "--tree", "2x2", "--jobs", "2", "--size", "4KiB", "--window", "2", "--json")
    s = json.loads(out.out)
    assert rc == 1 and not s["ok"] and not s["exact"] and len(calls) == 2


@pytest.mark.parametrize("collective", ["reduce", "broadcast", "barrier", "reduce-scatter", "allgather"])
@pytest.mark.parametrize("mode", ["I", "II", "III"])
def test_demo_collectives_in_the_rc_modes_on_a_tree_are_exact_under_loss(capsys, mode, collective):
    rc, out = run_cli(capsys, "--tree", "2x2", "--mode", mode, "--collective", collective, "--root", "3", "--size",
                      "8KiB", "--loss", "0.05", "--dup", "0.05", "--reorder", "0.05", "--seed", "4", "--json")
    s = json.loads(out.out)
    assert rc == 0 and s["ok"] and s["exact"] and s["mode"] == mode and s["collective"] == collective
    assert s["drops"]["link"].get("lost", 0) > 0 or collective == "barrier"  # a barrier sends one chunk per rank


def test_demo_collective_fails_when_a_rank_differs_from_numpy(capsys, monkeypatch):
    from inagg.host import collectives

    real = collectives.reference
    monkeypatch.setattr(collectives, "reference", lambda *a, **kw: [x + 1 for x in real(*a, **kw)])
    rc, out = run_cli(capsys, "--collective", "allgather", "--size", "4KiB", "--workers", "2")
    assert rc == 1 and "FAIL" in out.out

"""The schedule CLI (host/schedules/cli.py, wired into `inagg` by the lead)."""

import argparse
import json

import numpy as np
import pytest

from inagg.host.schedules import cli
from inagg.host.schedules.plot import crossovers


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_schedule_json(capsys):
    rc, out, _ = run(capsys, "schedule", "--algo", "swing-bw", "--topo", "torus:4x4", "--size", "1MiB", "--json")
    assert rc == 0
    d = json.loads(out)
    for key in ("algo", "ranks", "steps", "bytes_per_rank", "time_s", "xi"):
        assert key in d
    assert d["algo"] == "swing-bw" and d["ranks"] == 16 and d["steps"] == 8 and d["checked"]


def test_schedule_json_symbolic_check_above_the_exact_limit(capsys):
    rc, out, _ = run(capsys, "schedule", "--algo", "swing-bw", "--topo", "torus:32x32", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["ranks"] == 1024 > cli.EXACT_CHECK_RANKS and d["check"] == "symbolic" and d["steps"] == 20
    rc, out, _ = run(capsys, "schedule", "--algo", "ring", "--topo", "ring:8", "--json")
    assert json.loads(out)["check"] == "exact"


def test_schedule_errors(capsys):
    rc, _, err = run(capsys, "schedule", "--algo", "rabenseifner", "--topo", "torus:6x4")
    assert rc == 2 and "power-of-two dimensions" in err
    rc, _, err = run(capsys, "schedule", "--topo", "ring:4")
    assert rc == 2 and "--algo is required" in err
    rc, _, err = run(capsys, "schedule", "--algo", "ring", "--topo", "hypercube:4")
    assert rc == 2 and "unknown topology kind" in err


def test_compare_and_plot(capsys, tmp_path):
    png = tmp_path / "cmp.png"
    rc, out, _ = run(capsys, "schedule", "compare", "--topo", "ring:27", "--sizes", "1KiB..1MiB:8", "--json",
                     "--plot", str(png))
    assert rc == 0
    d = json.loads(out)
    assert {"ring", "swing-bw", "trivance-lat"} <= set(d["algos"])
    assert png.stat().st_size > 1000
    t = {a: [c["time_s"] for c in cs] for a, cs in d["algos"].items()}
    tri = [min(x) for x in zip(*(v for a, v in t.items() if a.startswith("trivance")))]
    sw = [min(x) for x in zip(*(v for a, v in t.items() if a.startswith("swing")))]
    ts = d["trivance_vs_swing"]
    assert ts["trivance_faster"] == [x for x, a, b in zip(d["sizes"], tri, sw) if a < b]
    assert ts["trivance_faster"]  # 27 = 3^3 ranks: Trivance's home ground
    for x in ts["crossovers"]:
        assert d["sizes"][0] < x < d["sizes"][-1]


def test_compare_text_names_the_trivance_swing_crossover(capsys):
    rc, out, _ = run(capsys, "schedule", "compare", "--topo", "torus:8x8", "--sizes", "1KiB..1GiB:4")
    assert rc == 0
    line = out.splitlines()[-1]
    assert line.startswith("fastest Trivance beats fastest Swing: at ") and "crossovers: " in line
    assert "crossovers: none" not in line  # the torus has both regimes (docs/results/schedules.md)
    rc, out, _ = run(capsys, "schedule", "compare", "--topo", "ring:4", "--collective", "alltoall", "--sizes",
                     "1KiB,1MiB")
    assert rc == 0 and "Trivance" not in out  # neither does all-to-all: nothing to compare


def test_crossovers():
    s = [1, 2, 4, 8]
    two = np.full(4, 2.0)
    assert crossovers(s, {"a": np.array([1, 4, 4, 4.0]), "b": two}, "a", "b") == pytest.approx([2 ** 0.5])
    assert crossovers(s, {"a": np.array([1, 2, 3, 4.0]), "b": two}, "a", "b") == pytest.approx([2])  # a tie
    assert crossovers(s, {"a": np.array([1, 2, 2, 4.0]), "b": two}, "a", "b") == pytest.approx([8 ** 0.5])
    assert crossovers(s, {"a": np.array([1, 2, 1, 1.0]), "b": two}, "a", "b") == []  # touches, never crosses
    assert crossovers(s, {"a": np.array([1, 3, 1, 3.0]), "b": two}, "a", "b") == pytest.approx(
        [1.5486, 2.5830, 6.1943], rel=1e-4)


def test_help_lists_algorithms_and_topology_grammar():
    parser = argparse.ArgumentParser(prog="inagg")
    sub = parser.add_subparsers(dest="command")
    cli.register(sub)
    text = sub.choices["schedule"].format_help()
    for name in ("ring", "dbtree", "rd", "rabenseifner", "bruck", "swing-lat", "swing-bw", "trivance-lat",
                 "trivance-bw", "ina", "direct", "fast"):
        assert f"\n  {name} " in text
    for spec in ("ring:N", "torus:AxB[xC...]", "clos:LEAVESxHOSTS:OVERSUB", "multirail:SERVERSxGPUS"):
        assert spec in text


def test_alltoall_json(capsys):
    rc, out, _ = run(capsys, "alltoall", "--servers", "4", "--gpus-per-server", "8", "--zipf", "0.8", "--json")
    d = json.loads(out)
    assert rc == 0 and d["makespan"] == d["lower_bound"] and d["stages"] >= 1 and d["compute_us"] > 0
    assert len(d["plan"]) == d["stages"] and sum(st["bytes"] for st in d["plan"]) == d["lower_bound_bytes"]
    assert all(sorted(st["send_to"]) == [0, 1, 2, 3] for st in d["plan"])  # one-to-one: no incast


def test_alltoall_errors(capsys):
    with pytest.raises(SystemExit):
        run(capsys, "alltoall", "--servers", "2", "--gpus-per-server", "0")
    assert "argument --gpus-per-server: must be a positive integer, not '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(capsys, "alltoall", "--servers", "two", "--gpus-per-server", "2")
    assert "argument --servers: must be a positive integer, not 'two'" in capsys.readouterr().err
    rc, _, err = run(capsys, "alltoall", "--servers", "1", "--gpus-per-server", "1")
    assert rc == 2 and "an all-to-all needs at least 2 GPUs, not 1 x 1" in err
    rc, _, err = run(capsys, "alltoall", "--servers", "2", "--gpus-per-server", "2", "--zipf", "-1")
    assert rc == 2 and "zipf skew must be non-negative, not -1.0" in err


def test_sizes():
    assert cli.parse_size("64KiB") == 65536
    assert cli.parse_sizes("1KiB..8KiB") == [1024, 2048, 4096, 8192]
    assert cli.parse_sizes("1,2") == [1, 2]
    with pytest.raises(argparse.ArgumentTypeError, match="bad size"):
        cli.parse_size("12 parsecs")


def test_add_parser_mounts_on_a_parent():
    parser = argparse.ArgumentParser(prog="inagg")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["alltoall", "--servers", "2", "--gpus-per-server", "2"])
    assert args.func is cli._cmd_alltoall

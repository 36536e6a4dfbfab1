"""The schedule CLI (host/schedules/cli.py, wired into `inagg` by the lead)."""

import argparse
import json

import pytest

from inagg.host.schedules import cli


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


def test_alltoall_json(capsys):
    rc, out, _ = run(capsys, "alltoall", "--servers", "4", "--gpus-per-server", "8", "--zipf", "0.8", "--json")
    d = json.loads(out)
    assert rc == 0 and d["makespan"] == d["lower_bound"] and d["stages"] >= 1 and d["compute_us"] > 0


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

"""``dist.init_process_group("inagg")``: collectives and training against gloo under torchrun, the gloo fallback."""

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'inagg[torch]' (CI installs it)")
import torch.distributed as dist  # noqa: E402

import inagg.host.torch_backend as tb  # noqa: E402
from inagg.host.exact import SumOverflowError  # noqa: E402
from inagg.host.service import ENV_SWITCH, SwitchService  # noqa: E402
from inagg.models.job import SwitchSpec  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _one_rank(monkeypatch, switch=None):
    """A one-rank "inagg" default group, through a service in this process with the backend ``switch``."""
    spec = SwitchSpec(ports=1, slots=64)
    with SwitchService(spec, vxlan=("127.0.0.1", 0), switch=switch and switch(spec)) as service:
        monkeypatch.setenv(ENV_SWITCH, "%s:%d" % service.control_address)
        dist.init_process_group("inagg", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        try:
            yield dist.distributed_c10d._get_default_group()
        finally:
            dist.destroy_process_group()


@pytest.fixture
def one_rank(monkeypatch):
    with _one_rank(monkeypatch) as pg:
        yield pg


def test_the_backend_is_registered_and_made_by_init_process_group(one_rank):
    assert isinstance(one_rank, tb.ProcessGroupInagg) and dist.get_backend() == "inagg"
    t = torch.arange(10, dtype=torch.float32)
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, tb.InaggWork)
    work.wait()
    assert torch.equal(t, torch.arange(10, dtype=torch.float32)) and tb.fallback_counts() == {}


def test_what_the_switch_does_not_do_runs_on_gloo_counted_and_logged_once_per_kind(one_rank, caplog):
    caplog.set_level(logging.WARNING, "inagg.torch")
    t = torch.tensor([3.0, -1.0])
    for _ in range(3):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.all_reduce(torch.ones(2, dtype=torch.float64))
    assert tb.fallback_counts() == {"allreduce MAX torch.float32": 3, "allreduce SUM torch.float64": 1}
    assert [r.getMessage() for r in caplog.records] == [
        f"inagg: allreduce {kind} is not done by the switch; it runs on gloo (counted in fallback_counts())"
        for kind in ("MAX torch.float32", "SUM torch.float64")]
    assert torch.equal(t, torch.tensor([3.0, -1.0]))


def test_an_int32_sum_out_of_range_raises_through_the_work_and_breaks_the_group(monkeypatch, promoting_switch):
    with _one_rank(monkeypatch, promoting_switch):
        t = torch.tensor([7, 8], dtype=torch.int32)
        work = dist.all_reduce(t, async_op=True)
        with pytest.raises(SumOverflowError, match=r"^job \d+ worker 0: an int32 sum overflowed"):
            work.wait()
        assert torch.equal(t, torch.tensor([7, 8], dtype=torch.int32))
        with pytest.raises(SumOverflowError):  # the job is out of step: every later call fails alike
            dist.barrier()


def test_fallback_counts_names_a_group_of_another_backend():
    with pytest.raises(TypeError, match="^not an inagg process group: str$"):
        tb.fallback_counts("gloo")


def _summaries(out: str) -> list[dict]:
    """Every JSON object the ranks printed: two ranks writing to one pipe may put two on one line."""
    decoder, found, i = json.JSONDecoder(), [], out.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(out, i)
        except json.JSONDecodeError:
            i = out.find("{", i + 1)
            continue
        found.append(obj)
        i = out.find("{", end)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("nproc, served", [(2, False), (4, True)])
def test_every_collective_matches_gloo(torchrun, served_switch, nproc, served):
    env = {ENV_SWITCH: served_switch("--ports", "4", "--slots", "64")[1]} if served else None
    rc, out, err = torchrun("tests/torch/collectives_vs_gloo.py", nproc, env=env)
    assert rc == 0, out + err
    ranks = _summaries(out)
    assert sorted(r["rank"] for r in ranks) == list(range(nproc)), out + err
    for r in ranks:
        assert {k: v for k, v in r["results"].items() if v != "ok"} == {}, r
        assert r["fallbacks"] == {"allreduce MAX torch.float32": 2}


@pytest.mark.slow
@pytest.mark.parametrize("nproc, args", [(4, ()), (2, ("--amp", "--inf-steps", "1,4"))])
def test_training_matches_gloo_and_grad_scaler_skips_the_same_steps(torchrun, nproc, args):
    rc, out, err = torchrun("examples/pg_train.py", nproc, "--steps", "6", *args)
    assert rc == 0, out + err
    (s,) = _summaries(out)
    assert s["ok"] and s["max_param_diff"] <= s["bound"] and s["fallbacks"] == {}, s
    assert s["skipped"] == ({"inagg": [1, 4], "gloo": [1, 4]} if args else {"inagg": [], "gloo": []})


@pytest.mark.slow
@pytest.mark.parametrize("nproc, mode", [(2, "--allreduce"), (4, "--ddp"), (3, "--die")])
def test_a_killed_switch_or_rank_fails_every_rank_within_two_seconds_typed(served_switch, tmp_path, nproc, mode):
    serve, addr = served_switch("--ports", "4", "--slots", "64")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
           "tests/torch/until_failure.py", mode, *(["1"] if mode == "--die" else [])]
    # stderr to a file: a pipe nobody reads while the ranks run would fill and stop them.
    with open(tmp_path / "stderr", "w+") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1", ENV_SWITCH: addr})
        try:
            ready, lines = 0, []
            while ready < nproc:
                lines.append(p.stdout.readline())
                assert lines[-1], "".join(lines) + open(log.name).read()
                ready += lines[-1].strip() == "ready"
            gone = time.time()
            if mode != "--die":
                serve.send_signal(signal.SIGKILL)
            out = "".join(lines) + p.communicate(timeout=120)[0]
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        err = open(log.name).read()
    ranks = _summaries(out)
    assert sorted(r["rank"] for r in ranks) == list(range(nproc)), out + err
    if mode == "--die":  # rank 1 ended its process: its watch closed without leaving
        gone = next(r for r in ranks if r["rank"] == 1).pop("died")
        ranks = [r for r in ranks if r["rank"] != 1]
        what = "PeerFailedError"
        message = (r"rank {rank} of job (\d+): rank 1 of job \1 is gone: its control connection 127\.0\.0\.1:\d+ "
                   rf"closed without leaving the job \(service at {addr}\)")
    else:
        what = "SwitchGoneError"
        message = (rf"rank {{rank}} of job \d+: the inagg switch service at {addr} is gone \(the service closed the "
                   r"connection\): it stopped or died")
    for r in ranks:
        expected = message.format(rank=r["rank"])
        assert r["failure"] == what, r
        if mode == "--ddp":  # DDP's backward reports a failed future as RuntimeError (torch_backend.InaggWork)
            assert (r["module"], r["type"]) == ("builtins", "RuntimeError"), r
            assert re.match(f"Got the following error when running the callback: {what}: {expected}\n",
                            r["message"]), r
        else:
            assert (r["module"], r["type"]) == ("inagg.host.service", what), r
            assert re.fullmatch(expected, r["message"]), r
        assert r["at"] - gone < 2.0, r

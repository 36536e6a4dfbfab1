"""``dist.init_process_group("inagg")``: collectives and training against gloo under torchrun, the gloo fallback."""

import contextlib
import json
import logging
import re
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'inagg[torch]' (CI installs it)")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import inagg.host.torch_backend as tb  # noqa: E402
from inagg.host.exact import SumOverflowError  # noqa: E402
from inagg.host.service import ENV_SWITCH, SwitchGoneError, SwitchService  # noqa: E402
from inagg.models.job import SwitchSpec  # noqa: E402


@contextlib.contextmanager
def _one_rank(monkeypatch, rendezvous, switch=None):
    """A one-rank "inagg" default group, through a service in this process with the backend ``switch``."""
    spec = SwitchSpec(ports=1, slots=64)
    with SwitchService(spec, vxlan=("127.0.0.1", 0), switch=switch and switch(spec)) as service:
        monkeypatch.setenv(ENV_SWITCH, "%s:%d" % service.control_address)
        dist.init_process_group("inagg", init_method=f"tcp://{rendezvous}", rank=0, world_size=1)
        try:
            yield dist.distributed_c10d._get_default_group(), service
        finally:
            dist.destroy_process_group()


@pytest.fixture
def one_rank(monkeypatch, unused_address):
    with _one_rank(monkeypatch, unused_address()) as (pg, _):
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


def test_an_int32_sum_out_of_range_raises_through_the_work_and_breaks_the_group(monkeypatch, promoting_switch,
                                                                                  unused_address):
    with _one_rank(monkeypatch, unused_address(), promoting_switch):
        t = torch.tensor([7, 8], dtype=torch.int32)
        work = dist.all_reduce(t, async_op=True)
        with pytest.raises(SumOverflowError, match=r"^job \d+ worker 0: an int32 sum overflowed"):
            work.wait()
        assert torch.equal(t, torch.tensor([7, 8], dtype=torch.int32))
        with pytest.raises(SumOverflowError):  # the job is out of step: every later call fails alike
            dist.barrier()


def test_a_stopped_service_fails_ddp_backward_with_the_inagg_error_itself(monkeypatch, unused_address):
    with _one_rank(monkeypatch, unused_address()) as (pg, service):
        ddp = DDP(nn.Linear(3, 2))
        ddp(torch.ones(4, 3)).sum().backward()
        assert torch.equal(ddp.module.weight.grad, torch.full((2, 3), 4.0))
        service.stop()
        message = (rf"^rank 0 of job \d+: the inagg switch service is stopping \(service at "
                   rf"{service.control_address[0]}:{service.control_address[1]}\)$")
        for _ in range(2):  # DDP's state stays whole: the next step fails alike
            with pytest.raises(SwitchGoneError, match=message):
                ddp(torch.ones(4, 3)).sum().backward()
        assert isinstance(pg.failure, SwitchGoneError)


def test_a_failed_call_outside_backward_raises_from_wait_and_names_its_type_in_the_future(monkeypatch,
                                                                                          unused_address):
    with _one_rank(monkeypatch, unused_address()) as (pg, service):
        service.stop()
        t = torch.ones(3)
        work = dist.all_reduce(t, async_op=True)
        # PyTorch turns an error raised in a future's callback into a RuntimeError: the type leads its message.
        with pytest.raises(RuntimeError, match=r"^Got the following error when running the callback: "
                                               r"SwitchGoneError: rank 0 of job \d+: the inagg switch service is "
                                               r"stopping"):
            work.get_future().wait()
        with pytest.raises(SwitchGoneError):
            work.wait()
        with pytest.raises(SwitchGoneError):  # and every later call, at once
            dist.all_reduce(t)
        assert torch.equal(t, torch.ones(3))


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
@pytest.mark.parametrize("nproc, mode", [(2, "--allreduce"), (4, "--ddp"), (2, "--hook"), (3, "--die")])
def test_a_killed_switch_or_rank_fails_every_rank_within_two_seconds_typed(served_switch, torchrun_process, nproc,
                                                                           mode):
    serve, addr = served_switch("--ports", "4", "--slots", "64")
    ranks = torchrun_process("tests/torch/until_failure.py", nproc, mode, *(["1"] if mode == "--die" else []),
                             env={ENV_SWITCH: addr})
    ranks.wait_for(r"ready (\d+)", nproc, 240)
    gone = time.time()
    if mode != "--die":
        serve.kill()
    assert ranks.finish(120) == 0, ranks.report()
    out = ranks.out
    summaries = _summaries(out)
    assert sorted(r["rank"] for r in summaries) == list(range(nproc)), ranks.report() + serve.report()
    if mode == "--die":  # rank 1 ended its process: its watch closed without leaving
        gone = next(r for r in summaries if r["rank"] == 1).pop("died")
        summaries = [r for r in summaries if r["rank"] != 1]
        what = "PeerFailedError"
        message = (r"rank {rank} of job (\d+): rank 1 of job \1 is gone: its control connection 127\.0\.0\.1:\d+ "
                   rf"closed without leaving the job \(service at {addr}\)")
    else:
        what = "SwitchGoneError"
        message = (rf"rank {{rank}} of job \d+: the inagg switch service at {addr} is gone \(the service closed the "
                   r"connection\): it stopped or died")
    for r in summaries:
        # What the training script catches, from dist.all_reduce and from DDP's backward() alike.
        assert (r["module"], r["type"], r["failure"]) == ("inagg.host.service", what, what), r
        assert re.fullmatch(message.format(rank=r["rank"]), r["message"]), r
        assert r["at"] - gone < 2.0, r

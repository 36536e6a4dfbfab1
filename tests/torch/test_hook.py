"""PyTorch DDP through inagg: set-up through the store, the hook, fallbacks, and torchrun runs against gloo."""

import copy
import json
import math
import warnings
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'inagg[torch]' (CI installs it)")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from inagg.host.service import (  # noqa: E402
    ENV_SWITCH, ServiceError, SwitchClient, SwitchGoneError, SwitchService, SwitchUnavailableError,
)
from inagg.host.torch import (  # noqa: E402
    EMBEDDED_CHUNK_BYTES, InaggFallbackWarning, allreduce_hook, group_from_process_group, leave,
)
from inagg.host.worker import ChunkTimeoutError, Timing  # noqa: E402
from inagg.models.job import SwitchSpec  # noqa: E402



@pytest.fixture
def world(monkeypatch, unused_address):
    """A one-rank gloo world in this process; no switch address in the environment."""
    for var in (ENV_SWITCH, "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    dist.init_process_group("gloo", init_method=f"tcp://{unused_address()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_unreachable_switch_fails_setup_with_the_address(world, unused_address):
    addr = unused_address()
    with pytest.raises(SwitchUnavailableError, match=f"cannot reach the inagg switch service at {addr}"):
        group_from_process_group(switch=addr)


def test_embedded_switch_needs_every_rank_on_this_machine(world):
    with pytest.raises(SwitchUnavailableError, match=f"no switch service: set {ENV_SWITCH}=HOST:PORT"):
        group_from_process_group()


def test_refused_job_names_the_reason(world):
    with SwitchService(SwitchSpec(ports=1, slots=64), vxlan=("127.0.0.1", 0)) as service, \
            SwitchClient(service.control_address) as squatter:
        squatter.create_job(1, window=4)
        with pytest.raises(SwitchUnavailableError, match="refused create_job: a job of 1 workers needs 1 free "
                                                         "switch ports; 0 of 1 are free"):
            group_from_process_group(switch="%s:%d" % service.control_address, window=4)


def test_a_rank_that_cannot_attach_fails_every_rank_or_falls_back(world, monkeypatch):
    import inagg.host.torch as inagg_torch

    def refuse(ticket, rank, **kw):
        raise ServiceError("inagg switch service refused attach: job 1: wrong token")

    monkeypatch.setattr(inagg_torch, "join", refuse)
    reason = "rank 0 could not attach to the inagg job: inagg switch service refused attach: job 1: wrong token"
    with pytest.raises(SwitchUnavailableError, match=f"^{reason}$"):
        group_from_process_group(switch="embedded", window=4)
    with pytest.warns(InaggFallbackWarning, match=f"^inagg: {reason}; gradients are all-reduced by the process "
                                                  "group instead$"):
        state = group_from_process_group(switch="embedded", window=4, fallback=True)
    assert state.group is None and state.fallback_reason == reason


def _step(ddp: DDP) -> None:
    ddp.zero_grad()
    ddp(torch.ones(4, 3)).sum().backward()


def test_fallback_warns_once_and_uses_the_process_group(world, unused_address):
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(3, 2))
    with pytest.warns(InaggFallbackWarning, match="gradients are all-reduced by the process group instead") as w:
        state = group_from_process_group(switch=unused_address(), fallback=True)
    assert len(w) == 1 and state.group is None
    ddp.register_comm_hook(state, allreduce_hook)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(ddp)
    assert torch.equal(ddp.module.weight.grad, torch.full((2, 3), 4.0))


def test_hook_averages_buckets_and_keeps_their_dtype(world):
    state = group_from_process_group(switch="embedded", window=4)
    assert state.group.switch.chunk_bytes == EMBEDDED_CHUNK_BYTES == 4096
    try:
        for dtype, rtol in ((torch.float32, 2**-23), (torch.bfloat16, 2**-8)):
            torch.manual_seed(1)
            model = nn.Linear(300, 7).to(dtype)
            ref = copy.deepcopy(model)
            ddp = DDP(model)
            ddp.register_comm_hook(state, allreduce_hook)
            x = torch.randn(5, 300).to(dtype)
            ddp(x).square().sum().backward()
            ref(x).square().sum().backward()
            got, want = model.weight.grad, ref.weight.grad
            assert got.dtype == dtype
            # One rank: the average is its own gradient, on the quantization grid of its largest element.
            atol = float(want.abs().max()) * 2.0**-30
            assert torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol)
        with pytest.raises(TypeError, match="inagg all-reduces float32, bfloat16 and float16 tensors, not "
                                            "torch.float64"):
            state.reduce(torch.ones(3, dtype=torch.float64))
    finally:
        state.close()


def _hooked(state, seed: int, inputs: int, outputs: int) -> tuple[DDP, nn.Module]:
    """A ``Linear`` from ``seed`` in DDP with ``state``'s hook, and a plain copy of it."""
    torch.manual_seed(seed)
    model = nn.Linear(inputs, outputs)
    ref = copy.deepcopy(model)
    ddp = DDP(model)
    ddp.register_comm_hook(state, allreduce_hook)
    return ddp, ref


def test_hook_passes_nan_and_infinity_as_gloo_does(world):
    state = group_from_process_group(switch="embedded", window=4)
    try:
        ddp, ref = _hooked(state, 3, 40, 3)
        x = torch.randn(5, 40)
        x[1, 7], x[2, 9] = math.inf, math.nan  # weight columns 7 (inf) and 9 (NaN)
        ddp(x).sum().backward()
        ref(x).sum().backward()
        got, want = ddp.module.weight.grad, ref.weight.grad
        assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()
        assert torch.equal(got.isinf(), want.isinf()) and want.isinf().any()
        assert torch.equal(got[got.isinf()], want[want.isinf()])
        finite = want.isfinite()
        assert torch.allclose(got[finite], want[finite], rtol=2**-20, atol=float(want[finite].abs().max()) * 2.0**-30)
    finally:
        state.close()


def test_hook_handles_fp32_promoted_results(world, promoting_switch):
    spec = SwitchSpec(ports=1, slots=64)
    with SwitchService(spec, vxlan=("127.0.0.1", 0), switch=promoting_switch(spec)) as service:
        state = group_from_process_group(switch="%s:%d" % service.control_address, window=4)
        ddp, ref = _hooked(state, 2, 50, 3)
        x = torch.randn(6, 50)
        ddp(x).square().sum().backward()
        ref(x).square().sum().backward()
        assert state.group.worker.stats["fp32_results"] == state.group.worker.stats["results"] > 0
        # FP32 lanes round the integer sum to 24 bits: relative 2**-24, plus the grid of the largest element.
        atol = float(ref.weight.grad.abs().max()) * 2.0**-30
        assert torch.allclose(ddp.module.weight.grad, ref.weight.grad, rtol=2**-22, atol=atol)
        state.close()


def test_a_stopped_service_fails_backward_with_the_inagg_error_itself(world):
    service = SwitchService(SwitchSpec(ports=1, slots=64), vxlan=("127.0.0.1", 0)).start()
    state = group_from_process_group(switch="%s:%d" % service.control_address, window=4)
    ddp = DDP(nn.Linear(3, 2))
    ddp.register_comm_hook(state, allreduce_hook)
    _step(ddp)
    service.stop()
    message = (rf"^rank 0 of job \d+: the inagg switch service is stopping \(service at "
               rf"{service.control_address[0]}:{service.control_address[1]}\)$")
    for _ in range(2):  # DDP's state stays whole: the next step fails alike
        with pytest.raises(SwitchGoneError, match=message):
            _step(ddp)
    assert isinstance(state.failure, SwitchGoneError)
    # Called outside a backward pass, the hook's future fails with the error itself.
    fut = allreduce_hook(state, SimpleNamespace(buffer=lambda: torch.ones(3)))
    with pytest.raises(SwitchGoneError, match=message):
        fut.wait()
    state.close()


def test_a_switch_that_never_answers_fails_backward_with_chunk_timeout(world, silent_switch):
    spec = SwitchSpec(ports=1, slots=64)
    with SwitchService(spec, vxlan=("127.0.0.1", 0), switch=silent_switch(spec)) as service:
        state = group_from_process_group(switch="%s:%d" % service.control_address, window=4,
                                         timing=Timing(timeout=0.01, max_timeout=0.01, tries=3))
        ddp = DDP(nn.Linear(3, 2))
        ddp.register_comm_hook(state, allreduce_hook)
        with pytest.raises(ChunkTimeoutError, match=r"^job \d+ worker 0: no result for chunk \d+ after 3 tries"):
            _step(ddp)
        state.close()


def _torchrun(torchrun, nproc: int, *args: str, env=None) -> dict:
    rc, out, err = torchrun("examples/ddp_train.py", nproc, "--json", *args, env=env)
    assert rc == 0, out + err
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


def _check(summary: dict, world_size: int) -> None:
    inagg = summary["runs"]["inagg"]
    assert summary["ok"] and summary["world_size"] == world_size
    assert inagg["gradient_check"]["ok"] and inagg["gradient_check"]["worst_error_to_bound"] <= 1
    assert summary["max_loss_rel_diff"] <= 1e-4
    assert inagg["losses"][-1] < inagg["losses"][0]  # it trains


@pytest.mark.slow
def test_torchrun_two_ranks_float32_matches_gloo(torchrun):
    _check(_torchrun(torchrun, 2, "--backend", "both", "--steps", "4"), 2)


@pytest.mark.slow
def test_torchrun_four_ranks_bfloat16_through_a_served_switch_matches_gloo(torchrun, served_switch):
    serve, addr = served_switch("--ports", "4", "--slots", "64")
    _check(_torchrun(torchrun, 4, "--backend", "both", "--steps", "3", "--dtype", "bfloat16", "--window", "16",
                     env={ENV_SWITCH: addr}), 4)
    serve.popen.terminate()
    assert serve.finish(30) == 0, serve.report()


def test_exit_process_flushes_destroys_the_groups_and_exits_with_the_code(unused_address):
    import subprocess
    import sys

    script = (
        "import sys, atexit, torch.distributed as dist\n"
        "from inagg.host.torch import exit_process\n"
        f"dist.init_process_group('gloo', init_method='tcp://{unused_address()}', rank=0, world_size=1)\n"
        "atexit.register(lambda: print('finalized'))\n"
        "dist.destroy_process_group = (lambda f: lambda: (print('destroyed', end=' '), f()))(dist.destroy_process_group)\n"
        "print('out', end=' '); print('err', end=' ', file=sys.stderr)\n"
        "exit_process(3)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    # Buffered output reaches the pipes; the interpreter is not finalized (no atexit handler runs).
    assert (p.returncode, p.stdout, p.stderr) == (3, "out destroyed ", "err ")


def _member(events: list, name: str):
    """A group, control connection and service whose release is appended to ``events``."""
    group = SimpleNamespace(port=SimpleNamespace(close=lambda: events.append(f"{name} socket")),
                            close=lambda: events.append(f"{name} responder"), job=SimpleNamespace(job=7))
    return group, SimpleNamespace(close=lambda: events.append(f"{name} job")), \
        SimpleNamespace(stop=lambda: events.append(f"{name} service"))


def test_rank_0_ends_the_job_only_after_every_rank_has_left():
    import threading
    import time

    store, events = dist.HashStore(), []
    group0, owner, service = _member(events, "rank 0")
    group1, _, _ = _member(events, "rank 1")

    def late_rank_1():
        time.sleep(0.3)  # still waiting for its last result
        leave(store, 1, 2, group1, None, None)

    t = threading.Thread(target=late_rank_1)
    t.start()
    leave(store, 0, 2, group0, owner, service)
    t.join()
    assert events == ["rank 0 responder", "rank 0 socket", "rank 1 responder", "rank 1 socket", "rank 0 job",
                      "rank 0 service"]


def test_rank_0_ends_the_job_after_the_timeout_when_a_rank_never_leaves():
    store, events = dist.HashStore(), []
    group0, owner, service = _member(events, "rank 0")
    with pytest.warns(RuntimeWarning, match=r"^inagg: ranks \[1, 2\] did not leave job 7 within 0.2 s; ending it"):
        leave(store, 0, 3, group0, owner, service, timeout=0.2)
    assert events == ["rank 0 responder", "rank 0 socket", "rank 0 job", "rank 0 service"]


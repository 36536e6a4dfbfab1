"""PyTorch DistributedDataParallel through inagg (the optional extra ``torch``).

Two pieces:

* :func:`group_from_process_group` turns a ``torch.distributed`` process
  group into the inagg :class:`~inagg.host.api.Group` of this rank: rank 0
  creates the job on the switch service, the job's ticket (switch and job
  descriptions, VXLAN address, token) goes to the other ranks through the
  process group's store, and every rank attaches its own VXLAN endpoint.
* :func:`allreduce_hook`, registered with ``ddp.register_comm_hook(state,
  allreduce_hook)``, all-reduces each gradient bucket through the switch and
  returns the average, as DDP expects. Every bucket is one
  :class:`~inagg.host.worker.AllReduce`, so each gets its own quantization
  scale from the agreement round of ``docs/protocol.md`` section 2.1, and
  INT32 and FP32-promoted results are dequantized alike; NaN and infinity
  reach every rank where gloo's sum has them. Buckets of float32, bfloat16
  and float16 are reduced in float32 and returned in their own type.

Where the switch is: ``switch="HOST:PORT"``, else ``INAGG_SWITCH``, else,
when every rank runs on this machine (torchrun's ``LOCAL_WORLD_SIZE`` equals
``WORLD_SIZE``), a switch service that rank 0 starts in a thread on
loopback. So ``torchrun --nproc-per-node 4 train.py`` needs nothing more,
and the same script reaches an ``inagg switch serve`` on another machine
with ``INAGG_SWITCH`` set.

When the switch is unreachable or refuses the job, every rank raises
:class:`~inagg.host.service.SwitchUnavailableError` with rank 0's reason;
with ``fallback=True`` every rank instead warns once and the hook uses the
process group's own all-reduce. The decision is made at set-up, on all ranks
together: a failure later, in the middle of training, fails ``backward()``
with the inagg error itself (ranks cannot switch transports in agreement
half-way through a step). Every rank watches the service
(:func:`~inagg.host.service.join` with ``watch``), so a service that stops
or dies, or a rank that fails, ends every rank's backward at once with
:class:`~inagg.host.service.SwitchGoneError` or
:class:`~inagg.host.service.PeerFailedError`.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import itertools
import os
import sys
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import NoReturn

import numpy as np

try:
    import torch
    import torch.distributed as dist
    from torch.autograd import Variable
except ImportError as e:  # the optional extra is not installed
    raise ImportError("inagg.host.torch needs PyTorch: pip install 'inagg[torch]'") from e

from inagg.models.job import SwitchSpec
from inagg.models.protocol import CHUNK_BYTES_ALLOWED

from inagg.host.api import Group, run
from inagg.host.service import ENV_SWITCH, ServiceError, SwitchClient, SwitchService, SwitchUnavailableError, Ticket, join
from inagg.host.worker import AllReduce, Timing

__all__ = ["BackwardCheck", "DistGroup", "InaggFallbackWarning", "group_from_process_group", "setup",
           "allreduce_hook", "leave", "exit_process", "LEAVE_TIMEOUT", "EMBEDDED_CHUNK_BYTES"]

#: Seconds rank 0 waits in :func:`leave` for the other ranks before it ends the job anyway.
LEAVE_TIMEOUT = 30.0
#: The embedded switch's chunk: the largest RoCE payload (an MTU of 4096). Its ranks share loopback, where such a
#: datagram needs no fragmenting, and a bucket then costs a quarter of the frames of 1 KB chunks.
EMBEDDED_CHUNK_BYTES = max(CHUNK_BYTES_ALLOWED)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Every call takes fresh store keys; all ranks call in the same order, as for any collective.
_calls = itertools.count()


class InaggFallbackWarning(RuntimeWarning):
    """The switch could not take the job; the process group's own all-reduce is used instead."""


class BackwardCheck:
    """Raises a collective's failure from ``backward()`` itself, with its own type and message.

    DDP waits for its buckets' futures in C++, and PyTorch turns an error
    met there into a ``RuntimeError`` that keeps only a message ("Unable to
    cast ...", "Got the following error when running the callback: ...").
    A Python exception raised by a callback of the autograd engine, however,
    reaches the caller of ``backward()`` as it was (PyTorch persists it
    across the engine's threads). So a collective that fails during a
    backward pass completes its future with the tensors it was given, and
    :meth:`arm`, called as the collective is issued, has the engine run a
    check once at the end of that backward pass, after DDP's own finaliser
    (DDP's state stays consistent, so the next step fails alike): the check
    waits until ``executor`` (one worker thread, running the collectives in
    order) has finished every collective issued before it, then raises
    ``failure()`` when that is not None. Outside a backward pass :meth:`arm`
    returns False and the caller reports the failure itself.
    """

    def __init__(self, executor: ThreadPoolExecutor, failure: Callable[[], Exception | None]):
        self._executor, self._failure = executor, failure
        self._armed_for: int | None = None
        self._lock = threading.Lock()

    def arm(self) -> bool:
        """Have ``check`` run at the end of the backward pass this thread is in; False when it is in none."""
        task = torch._C._current_graph_task_id()
        if task == -1:
            return False
        with self._lock:
            if self._armed_for == task:
                return True
            self._armed_for = task
        engine = Variable._execution_engine
        # DDP queues its finaliser after it hands over its last bucket, so after this callback: queued
        # from here, ``check`` runs after the finaliser.
        engine.queue_callback(lambda: engine.queue_callback(self._check))
        return True

    def _check(self) -> None:
        self._executor.submit(lambda: None).result()
        if (failure := self._failure()) is not None:
            raise failure


class DistGroup:
    """The inagg side of a ``torch.distributed`` process group, and the state of :func:`allreduce_hook`.

    ``group`` is this rank's :class:`~inagg.host.api.Group` (None after a
    fallback, then ``fallback_reason`` says why). Rank 0 also holds the
    control connection that owns the job, and the embedded service if it
    started one: :meth:`close` (or the end of the process) releases them.
    """

    def __init__(self, process_group, group: Group | None, *, fallback_reason: str | None = None, store=None,
                 owner: SwitchClient | None = None, service: SwitchService | None = None):
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.size = dist.get_world_size(process_group)
        self.group = group
        self.fallback_reason = fallback_reason
        #: The error that broke the group (None while it works): every later :meth:`reduce` raises it.
        self.failure: Exception | None = None
        self._store, self._owner, self._service = store, owner, service
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inagg-ddp")
        self.backward_check = BackwardCheck(self._executor, lambda: self.failure)

    def reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The average of ``tensor`` over the ranks through the switch, in ``tensor``'s dtype and on its device.

        A failure breaks the group: this rank closes its watch without leaving, so the service tells the
        other ranks (:class:`~inagg.host.service.PeerFailedError`), and every later call raises the same error.
        """
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"inagg all-reduces float32, bfloat16 and float16 tensors, not {tensor.dtype}")
        if self.group is None:
            raise RuntimeError(f"rank {self.rank}: no inagg group: {self.fallback_reason}")
        if self.failure is not None:
            raise self.failure
        data = tensor.detach().to(device="cpu", dtype=torch.float32).numpy().ravel()
        try:
            # NaN and infinity reach every rank where gloo's sum has them: GradScaler skips the step alike.
            total = run(AllReduce(self.group.worker, data, propagate_nonfinite=True), self.group).result()
        except Exception as e:  # the job is out of step now
            self.failure = e
            self.group.port.abort()
            raise
        avg = torch.from_numpy(total / np.float32(self.size)).reshape(tensor.shape)
        return avg.to(device=tensor.device, dtype=tensor.dtype)

    def close(self) -> None:
        """Release the VXLAN socket, then (rank 0) the job and the embedded service: see :func:`leave`."""
        self._executor.shutdown(wait=True)
        if self.group is not None:
            leave(self._store, self.rank, self.size, self.group, self._owner, self._service)


def _resolve_switch(switch: str | None, size: int, window: int) -> tuple[SwitchClient, SwitchService | None]:
    """Rank 0's control connection, and the service it started when there is none to reach."""
    if switch is None:
        switch = os.environ.get(ENV_SWITCH)
    if switch is None:
        local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
        if local is None or local != world:
            raise SwitchUnavailableError(f"no switch service: set {ENV_SWITCH}=HOST:PORT (an `inagg switch serve` "
                                         "every rank reaches), or pass switch=; an embedded switch serves only "
                                         "ranks on one machine")
        switch = "embedded"
    if switch != "embedded":
        return SwitchClient(switch), None
    slots = 1 << max(1, (2 * window - 1).bit_length())
    service = SwitchService(SwitchSpec(ports=size, slots=slots, chunk_bytes=EMBEDDED_CHUNK_BYTES), vxlan=("127.0.0.1", 0)).start()
    try:
        return SwitchClient(service.control_address), service
    except BaseException:
        service.stop()
        raise


def group_from_process_group(process_group=None, *, switch: str | None = None, window: int = 16,
                             timing: Timing | None = None, store=None, fallback: bool = False) -> DistGroup:
    """This rank's inagg group for ``process_group`` (the default group when None); every rank calls it.

    ``switch`` is the switch service's ``"HOST:PORT"``, ``"embedded"``, or
    None (see the module docstring). ``window`` is the chunks each rank keeps
    outstanding, ``timing`` its retransmission timers
    (:data:`~inagg.host.service.SERVICE_TIMING` when None). ``store`` defaults to the process group's own store.
    Raises :class:`~inagg.host.service.SwitchUnavailableError` on every rank
    when rank 0 cannot set the job up, unless ``fallback`` is true: then each
    rank warns once (:class:`InaggFallbackWarning`) and the returned group
    falls back to the process group's all-reduce.
    """
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call torch.distributed.init_process_group first")
    pg = process_group if process_group is not None else dist.group.WORLD
    rank, size = dist.get_rank(pg), dist.get_world_size(pg)
    if store is None:
        from torch.distributed.distributed_c10d import _get_process_group_store

        store = _get_process_group_store(pg)
    store = dist.PrefixStore(f"inagg/{next(_calls)}", store)
    try:
        group, owner, service = setup(store, rank, size, switch=switch, window=window, timing=timing, watch=True)
    except SwitchUnavailableError as e:
        return _failed(pg, str(e), fallback)
    return DistGroup(pg, group, store=store, owner=owner, service=service)


def setup(store, rank: int, size: int, *, switch: str | None = None, window: int = 16, timing: Timing | None = None,
          watch: bool = False) -> tuple[Group, SwitchClient | None, SwitchService | None]:
    """Rank ``rank`` of ``size`` joins one inagg job, agreed through the torch ``store``; every rank calls it.

    Rank 0 reaches the switch (``switch``, see the module docstring) and
    creates the job; the ticket reaches the other ranks through ``store``;
    every rank joins (``watch``: see :func:`~inagg.host.service.join`) and
    waits until all have. Returns this rank's group, and on rank 0 the
    control connection that owns the job and the embedded service (None
    elsewhere). Raises :class:`~inagg.host.service.SwitchUnavailableError`
    on every rank, with the first failing rank's reason, when any rank fails.
    """
    owner = service = None
    if rank == 0:
        try:
            owner, service = _resolve_switch(switch, size, window)
            ticket = owner.create_job(size, window=window)
            store.set("ticket", ticket.to_json())
        except (ServiceError, OSError) as e:
            _release(None, owner, service)
            store.set("ticket", "error:" + str(e))
            raise SwitchUnavailableError(str(e)) from None
    else:
        text = store.get("ticket").decode()
        if text.startswith("error:"):
            raise SwitchUnavailableError(f"rank 0 could not set up the inagg job: {text[6:]}")
        ticket = Ticket.from_json(text)
    try:
        group, status = join(ticket, rank, timing=timing, watch=watch), "ok"
    except (ServiceError, OSError) as e:
        group, status = None, f"rank {rank} could not attach to the inagg job: {e}"
    # Results to a rank that has not attached yet would be dropped: start when all have. Every rank
    # reads every rank's status, so all of them fail (or fall back) together.
    keys = [f"attached/{r}" for r in range(size)]
    store.set(keys[rank], status)
    store.wait(keys)
    failed = next((v for v in (store.get(k).decode() for k in keys) if v != "ok"), None)
    if failed is not None:
        _release(group, owner, service)
        raise SwitchUnavailableError(failed)
    return group, owner, service


def leave(store, rank: int, size: int, group: Group, owner: SwitchClient | None, service: SwitchService | None, *,
          timeout: float = LEAVE_TIMEOUT) -> None:
    """Rank ``rank`` is done with the job :func:`setup` gave it; every rank calls it, with what setup returned.

    Each rank closes its socket and says so in ``store``. Rank 0 ends the
    job, and stops the embedded service, only when every rank has, or after
    ``timeout`` s (a rank that died says nothing): a rank that has its last
    result may leave while another still waits for a retransmission of
    its own, and a service stopped under it would fail that rank's last call.
    """
    _release(group, None, None)
    store.set(f"left/{rank}", "")
    if owner is None and service is None:
        return
    try:
        store.wait([f"left/{r}" for r in range(size)], timedelta(seconds=timeout))
    except dist.DistStoreError:
        missing = [r for r in range(size) if not store.check([f"left/{r}"])]
        warnings.warn(f"inagg: ranks {missing} did not leave job {group.job.job} within {timeout:g} s; "
                      "ending it anyway", RuntimeWarning, stacklevel=2)
    _release(None, owner, service)


def _release(group: Group | None, owner: SwitchClient | None, service: SwitchService | None) -> None:
    if group is not None:
        group.close()
        group.port.close()
    if owner is not None:
        owner.close()
    if service is not None:
        service.stop()


def _failed(pg, reason: str, fallback: bool) -> DistGroup:
    if not fallback:
        raise SwitchUnavailableError(reason) from None
    warnings.warn(f"inagg: {reason}; gradients are all-reduced by the process group instead",
                  InaggFallbackWarning, stacklevel=3)
    return DistGroup(pg, None, fallback_reason=reason)


def allreduce_hook(state: DistGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket averaged over the ranks through the switch.

    Register with ``ddp.register_comm_hook(state, allreduce_hook)`` where
    ``state`` is :func:`group_from_process_group`'s result. Buckets are
    reduced one at a time on a helper thread, in the order DDP hands them
    over (the same on every rank), so backward computation overlaps the
    all-reduce. A failure makes ``backward()`` raise the inagg error itself
    (:class:`BackwardCheck`), on this rank and, through the service, on
    every other; :attr:`DistGroup.failure` holds it too.
    """
    tensor = bucket.buffer()
    if state.group is None:
        tensor.div_(state.size)
        work = dist.all_reduce(tensor, group=state.process_group, async_op=True)
        return work.get_future().then(lambda f: f.value()[0])
    fut: torch.futures.Future = torch.futures.Future()
    in_backward = state.backward_check.arm()
    # The copy is taken here, before DDP goes on: the thread reads only its own.
    data = tensor.detach().clone()

    def run() -> None:
        try:
            fut.set_result(state.reduce(data))
        except Exception as e:
            if in_backward:  # the bucket unchanged: the check at the end of backward() raises ``e``
                fut.set_result(tensor)
            else:  # DDP calls hooks in backward passes only; a caller outside one gets the error as the value
                fut.set_exception(e)

    state._executor.submit(run)
    return fut


def exit_process(code: int) -> NoReturn:
    """End this process with ``code`` without finalizing the interpreter: the last call of a torchrun script.

    Gloo's worker threads drop a collective's work, and with it its tensors,
    after the collective has completed. A tensor Python has let go of then
    needs the GIL, and in an interpreter that is being finalized taking it
    ends the thread by a forced unwind that C++ turns into an abort
    ("terminate called without an active exception"), after the script has
    done its work: a race of PyTorch's, with plain gloo too
    (pytorch/pytorch#179291). Process groups still initialized are destroyed
    first and the standard streams flushed; atexit handlers do not run.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

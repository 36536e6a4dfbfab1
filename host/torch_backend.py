"""inagg as a ``torch.distributed`` backend: ``dist.init_process_group("inagg")`` (the optional extra ``torch``).

Importing this module registers the backend ``"inagg"`` for CPU tensors
(``torch.distributed.Backend.register_backend``). Every rank of the group
joins one inagg job as :func:`inagg.host.torch.setup` does for the DDP hook
(the switch from ``INAGG_SWITCH``, or a service rank 0 embeds when every
rank is on this machine), so under torchrun::

    import inagg.host.torch_backend  # registers "inagg"
    dist.init_process_group("inagg")

What goes through the switch (``docs/scaleout.md``, "torch.distributed
backend"):

* ``all_reduce``, ``reduce`` and ``reduce_scatter`` with SUM or AVG of
  float32, float16 and bfloat16 (summed in float32 through the quantizing
  all-reduce, so within its error bound; NaN and infinity reach every rank
  where gloo's sum has them) and of int32 (summed exactly; a sum outside
  int32 raises :class:`~inagg.host.exact.SumOverflowError`, AVG rounds
  toward zero);
* ``broadcast`` and ``all_gather`` of any dtype, exactly (the owner's bytes
  summed with zeros), and ``barrier``.

Everything else runs on a gloo process group over the same store, and is
never silent: each call is counted in :attr:`ProcessGroupInagg.fallbacks`
(:func:`fallback_counts`) and the first of each kind logs a warning on the
``inagg.torch`` logger. PyTorch 2.13 sends ``all_gather_into_tensor``,
``reduce_scatter_tensor`` and ``all_to_all_single`` to a process group's
C++ backend without asking Python: those run on gloo uncounted, which the
log says once when the group is made.

Collectives are asynchronous: each call returns at once with a work object
whose future completes when a helper thread (one per group, so calls go out
in the order they were made, the same on every rank) has the result, so DDP
overlaps its buckets with the backward pass. A failure breaks the group:
``work.wait()``, a synchronous call, every later call and ``backward()``
of a DDP model on the group raise the inagg error itself (e.g.
:class:`~inagg.host.service.SwitchGoneError`), type and message kept
(:class:`InaggWork` says how); :attr:`ProcessGroupInagg.failure` holds it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

try:
    import torch
    import torch.distributed as dist
    from torch.futures import Future
except ImportError as e:  # the optional extra is not installed
    raise ImportError("inagg.host.torch_backend needs PyTorch: pip install 'inagg[torch]'") from e

from inagg.host.api import run
from inagg.host.exact import ExactSum
from inagg.host.torch import BackwardCheck, leave, setup
from inagg.host.worker import AllReduce

__all__ = ["BACKEND", "InaggWork", "ProcessGroupInagg", "fallback_counts"]

BACKEND = "inagg"
log = logging.getLogger("inagg.torch")

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)
# Methods of a process group that PyTorch hands to Python and the switch does not do.
_GLOO_ONLY = ("gather", "scatter", "alltoall", "alltoall_base", "send", "recv", "recv_anysource",
              "allreduce_coalesced", "allgather_coalesced")


def _unwrap(future: Future) -> list:
    """The value of a collective's inner future, or its error raised."""
    value = future.value()
    if isinstance(value, BaseException):
        raise value
    return value


class InaggWork(dist.Work):
    """A collective in flight; ``wait`` raises the inagg error of a failed one, type and message kept.

    The inner future completes with the result or with the error as its
    value: PyTorch 2.13's DDP reducer crashes the process (SIGSEGV) on a
    future that completes with a Python exception. A collective issued in a
    backward pass (DDP's buckets) gets a future that completes with its
    tensors even when it fails, because ``backward()`` itself raises the
    error (:class:`~inagg.host.torch.BackwardCheck`); elsewhere
    :meth:`get_future` raises the error in a callback, which PyTorch reports
    as ``RuntimeError: Got the following error when running the callback:
    SwitchGoneError: ...``.
    """

    def __init__(self, inner: Future, tensors: list[torch.Tensor] | None = None):
        super().__init__()
        self._inner = inner
        self._tensors = tensors  # set in a backward pass: what get_future completes with

    def wait(self, timeout=None) -> bool:
        self._inner.wait()
        _unwrap(self._inner)
        return True

    def get_future(self) -> Future:
        if self._tensors is not None:
            return self._inner.then(lambda _: self._tensors)
        return self._inner.then(_unwrap)

    def is_completed(self) -> bool:
        return self._inner.done()


def _bits(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` as int32 words, the last one padded with zeros."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    words = np.zeros(-(-raw.size // 4), np.int32)
    words.view(np.uint8)[:raw.size] = raw
    return words


def _set_bits(t: torch.Tensor, words: np.ndarray) -> None:
    """Write the bytes of ``words`` (as made by :func:`_bits` of a tensor like ``t``) into ``t``."""
    raw = words.view(np.uint8)[:t.numel() * t.element_size()].copy()
    t.copy_(torch.from_numpy(raw).view(t.dtype).reshape(t.shape))


class ProcessGroupInagg(dist.ProcessGroup):
    """The ``"inagg"`` process group of one rank; made by ``dist.init_process_group("inagg")``.

    ``store``, ``rank``, ``size`` and ``timeout`` are what PyTorch passes a
    backend; ``switch``, ``window`` and ``timing`` are those of
    :func:`inagg.host.torch.setup`. :attr:`group` is this rank's
    :class:`~inagg.host.api.Group`; :attr:`fallbacks` counts the calls that
    ran on gloo, by kind (``"allreduce MAX float32"``, ``"alltoall"``);
    :attr:`failure` is the error that broke the group (None while it works).
    """

    def __init__(self, store, rank: int, size: int, timeout, *, switch: str | None = None, window: int = 16,
                 timing=None):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, timeout)
        # Collectives PyTorch dispatches in C++ (the *_tensor ones) find gloo here.
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        self._store = dist.PrefixStore("inagg", store)
        self.group, self._owner, self._service = setup(self._store, rank, size,
                                                       switch=switch, window=window, timing=timing, watch=True)
        self.fallbacks: Counter = Counter()
        self._lock = threading.Lock()
        self.failure: Exception | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inagg-pg")
        self._backward_check = BackwardCheck(self._executor, lambda: self.failure)
        if rank == 0:
            log.info("inagg process group of %d ranks on job %d; all_gather_into_tensor, reduce_scatter_tensor and "
                     "all_to_all_single run on gloo (PyTorch dispatches them past Python process groups)",
                     size, self.group.job.job)

    def getBackendName(self) -> str:
        return BACKEND

    # -- through the switch ---------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts) -> dist.Work:
        (t,) = tensors
        if not self._reducible(t.dtype, opts.reduceOp):
            return self._fallback(f"allreduce {opts.reduceOp.op.name} {t.dtype}", self._gloo.allreduce, tensors, opts)
        return self._submit(lambda: t.copy_(self._reduce(t, opts.reduceOp).reshape(t.shape)), tensors)

    def reduce(self, tensors: list[torch.Tensor], opts) -> dist.Work:
        (t,) = tensors
        if not self._reducible(t.dtype, opts.reduceOp):
            return self._fallback(f"reduce {opts.reduceOp.op.name} {t.dtype}", self._gloo.reduce, tensors, opts)

        def body() -> None:
            total = self._reduce(t, opts.reduceOp)
            if self.rank() == opts.rootRank:
                t.copy_(total.reshape(t.shape))
        return self._submit(body, tensors)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts) -> dist.Work:
        (out,), (parts,) = outputs, inputs
        if not self._reducible(out.dtype, opts.reduceOp) or any(p.dtype != out.dtype for p in parts):
            return self._fallback(f"reduce_scatter {opts.reduceOp.op.name} {out.dtype}", self._gloo.reduce_scatter,
                                  outputs, inputs, opts)

        def body() -> None:
            total = self._reduce(torch.cat([p.reshape(-1) for p in parts]), opts.reduceOp)
            lo = sum(p.numel() for p in parts[:self.rank()])
            out.copy_(total[lo:lo + out.numel()].reshape(out.shape))
        return self._submit(body, outputs)

    def broadcast(self, tensors: list[torch.Tensor], opts) -> dist.Work:
        (t,) = tensors

        def body() -> None:
            words = _bits(t)
            if self.rank() != opts.rootRank:
                words[:] = 0
            total = self._exact(words)
            if self.rank() != opts.rootRank:
                _set_bits(t, total)
        return self._submit(body, tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts) -> dist.Work:
        (outs,), (t,) = outputs, inputs

        def body() -> None:
            words = _bits(t)
            n, r = words.size, self.rank()
            # Every rank's bytes at its own place, zeros elsewhere: the sum is everyone's bytes.
            flat = np.zeros(n * self.size(), np.int32)
            flat[r * n:(r + 1) * n] = words
            total = self._exact(flat)
            for k, o in enumerate(outs):
                _set_bits(o, total[k * n:(k + 1) * n])
        return self._submit(body, outputs)

    def barrier(self, opts) -> dist.Work:
        return self._submit(lambda: self._exact(np.zeros(1, np.int32)), [])

    # -- internals ------------------------------------------------------

    @staticmethod
    def _reducible(dtype: torch.dtype, op) -> bool:
        return (dtype in _FLOATS or dtype == torch.int32) and op.op in _OPS

    def _reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        """SUM or AVG of ``t`` over the ranks, flat, in ``t``'s dtype."""
        flat = t.detach().reshape(-1)
        if flat.dtype == torch.int32:
            total = torch.from_numpy(self._exact(flat.contiguous().numpy()))
            return torch.div(total, self.size(), rounding_mode="trunc") if op.op == dist.ReduceOp.AVG else total
        data = flat.to(torch.float32).numpy()
        total = run(AllReduce(self.group.worker, data, propagate_nonfinite=True), self.group).result()
        if op.op == dist.ReduceOp.AVG:
            total = total / np.float32(self.size())
        return torch.from_numpy(total).to(t.dtype)

    def _exact(self, words: np.ndarray) -> np.ndarray:
        return run(ExactSum(self.group.worker, words), self.group).result()

    def _submit(self, body: Callable[[], object], result: list) -> InaggWork:
        in_backward = self._backward_check.arm()
        if self.failure is not None:
            if in_backward:  # DDP's next step: its backward() raises the failure at its end
                done: Future = Future()
                done.set_result(self.failure)
                return InaggWork(done, result)
            raise self.failure
        inner: Future = Future()

        def task() -> None:
            if self.failure is None:
                try:
                    body()
                except Exception as e:  # the group's job is out of step now: every later call fails alike
                    self.failure = e
                    self.group.port.abort()  # the service tells the other ranks at once
            inner.set_result(result if self.failure is None else self.failure)

        self._executor.submit(task)
        return InaggWork(inner, result if in_backward else None)

    def _fallback(self, kind: str, call: Callable, *args) -> dist.Work:
        with self._lock:
            first = kind not in self.fallbacks
            self.fallbacks[kind] += 1
        if first:
            log.warning("inagg: %s is not done by the switch; it runs on gloo (counted in fallback_counts())", kind)
        return call(*args)

    def shutdown(self) -> None:
        """Finish the calls in flight, then release the socket, the job and the embedded service (:func:`leave`)."""
        self._executor.shutdown(wait=True)
        if self.group is not None:
            leave(self._store, self.rank(), self.size(), self.group, self._owner, self._service)
        self.group = self._owner = self._service = None


def _gloo_only(name: str):
    def method(self, *args):
        return self._fallback(name, getattr(self._gloo, name), *args)
    method.__name__ = name
    method.__doc__ = f"``{name}`` on gloo, counted in :attr:`ProcessGroupInagg.fallbacks`."
    return method


for _name in _GLOO_ONLY:
    setattr(ProcessGroupInagg, _name, _gloo_only(_name))


def fallback_counts(group=None) -> dict[str, int]:
    """Calls of the inagg process group ``group`` (the default group when None) that ran on gloo, by kind."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupInagg):
        raise TypeError(f"not an inagg process group: {type(pg).__name__}")
    return dict(pg.fallbacks)


def _create(store, rank: int, size: int, timeout) -> ProcessGroupInagg:
    return ProcessGroupInagg(store, rank, size, timeout)


dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])

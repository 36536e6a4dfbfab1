"""The switch interface: what every switch backend offers the service, the demo and the memory network.

A backend is one implementation of the switch: the reference
:class:`~inagg.models.switch.ModelSwitch`, the P4 profile switches
(:class:`~inagg.models.p4profile.P4ProfileSwitch`), the Verilated RTL in a
simulator child process (``inagg.testbench.bridge.realtime.RtlSwitch``).
Each subclasses :class:`SwitchBackend` and defines every member of it, so
a caller never asks a backend what it has.

:class:`DataPlane` is the part a network drives: frames in on a port,
frames out. A backend whose results come later than the frames that cause
them (a clocked one, such as the RTL) returns nothing from ``receive`` and
hands its results out of ``poll``; ``fileno`` is then a descriptor that
turns readable when ``poll`` has something. A backend without a clock
answers in ``receive``, polls empty and has no descriptor.

Backends are registered as Python entry points of the group
:data:`ENTRY_POINTS` (``pyproject.toml``); :func:`load_backend` finds one
by name without importing any other, so the host library reaches the RTL
without importing the testbench.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # the command line lists the backends without loading numpy
    from inagg.models.job import JobSpec, SwitchSpec
    from inagg.models.protocol import Counter

__all__ = ["DataPlane", "SwitchBackend", "Backend", "SwitchBackendError", "MissingTool", "ENTRY_POINTS",
           "DEFAULT_BACKEND", "backend_names", "load_backend"]

ENTRY_POINTS = "inagg.backends"
DEFAULT_BACKEND = "fast"
"""The backend the demo, the switch service and the DDP path open unless told otherwise: the fast software switch."""


class SwitchBackendError(RuntimeError):
    """The switch behind a backend failed (e.g. the RTL simulator exited); the message says how."""


class MissingTool(RuntimeError):
    """A tool a backend needs is not installed; the message says how to get it."""


@runtime_checkable
class DataPlane(Protocol):
    """Frames in on a port, frames out, as ``(port, frame)`` pairs in sending order."""

    def receive(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Take one frame that arrived on ``port``; return what the switch sends because of it now."""
        ...

    def receive_batch(self, frames: Iterable[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """Take ``(port, frame)`` pairs in arrival order; return what :meth:`receive` returns for each, in order.

        This default calls :meth:`receive` per frame; a backend that does better on many frames at once (the
        fast switch) overrides it.
        """
        return [out for port, frame in frames for out in self.receive(port, frame)]

    def poll(self) -> list[tuple[int, bytes]]:
        """The frames the switch sent since the last call that ``receive`` did not return."""
        ...

    @property
    def deadline(self) -> float | None:
        """When a driver in virtual time must call :meth:`on_timer` next; None (this default): never.

        A switch with timers of its own (the model switch's Mode III result timers) keeps its clock
        here, so the driver that owns the time runs them.
        """
        return None

    def on_timer(self, now: float) -> list[tuple[int, bytes]]:
        """Set the switch's clock to ``now``; return what timers due by then send (this default: nothing)."""
        return []


@runtime_checkable
class SwitchBackend(DataPlane, Protocol):
    """A whole switch: its data plane, its jobs, its counters and its lifetime.

    Members
    -------
    spec:
        The switch's :class:`~inagg.models.job.SwitchSpec`.
    counters:
        Every :class:`~inagg.models.protocol.Counter`, by counter.
    drops:
        Frames the backend could not carry to the switch at all, by reason
        (e.g. ``oversize``); the switch's own drops are in ``counters``.
    retired_slots:
        ``(first, count)`` slot regions a removed job left that the backend
        could not clear: no later job may take them until it restarts.
    per_worker_rkeys:
        Whether ``add_job`` takes a ``WorkerSpec.contrib_rkey`` per worker
        (the model, fast and RTL switches); a switch service gives each
        worker a key of its own where it does. False: one key per job.
    """

    spec: SwitchSpec
    counters: Mapping[Counter, int]
    drops: Mapping[str, int]
    retired_slots: Sequence[tuple[int, int]]
    per_worker_rkeys: bool = False

    def add_job(self, job: JobSpec) -> None:
        """Install ``job``; ``ValueError`` for a job this switch cannot hold."""
        ...

    def remove_job(self, job: int) -> None:
        """Tear job number ``job`` down and free what it held."""
        ...

    def fileno(self) -> int | None:
        """A descriptor readable when :meth:`poll` has frames, or None when ``receive`` answers at once."""
        ...

    def close(self) -> None:
        """Release what the backend holds (a simulator, sockets); the switch is unusable afterwards."""
        ...


@dataclass(frozen=True)
class Backend:
    """A registered backend: what an entry point of :data:`ENTRY_POINTS` names.

    ``open(spec, **options)`` returns a running :class:`SwitchBackend` for
    ``spec`` (``ValueError`` for options it cannot take). ``run``, where
    the backend has one, runs a whole all-reduce of workers inside the
    backend's own clock (the RTL simulator runs them in simulated time) and
    returns what they brought back; None where a caller drives the workers
    itself against :meth:`open`'s switch.
    """

    name: str
    open: Callable[..., SwitchBackend]
    run: Callable[..., Any] | None = None


def backend_names() -> list[str]:
    """The names of every registered backend, sorted."""
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINTS))


def load_backend(name: str) -> Backend:
    """The backend registered as ``name``.

    Raises ``ValueError`` for a name nobody registered and what importing
    the backend raises (``ImportError`` when its packages are missing).
    """
    found = entry_points(group=ENTRY_POINTS, name=name)
    if not found:
        known = ", ".join(backend_names()) or "none (is inagg installed? pip install -e .)"
        raise ValueError(f"no switch backend {name!r}; registered: {known}")
    backend = next(iter(found)).load()
    if not isinstance(backend, Backend):
        raise TypeError(f"entry point {name!r} of {ENTRY_POINTS} is a {type(backend).__name__}, not a Backend")
    return backend

"""The geometry of one RTL switch build, validated once.

:class:`SwitchGeometry` is what the build fixes and the read-only registers
``GEOMETRY``, ``JOBS`` and ``EXCEPTION`` report: ports, beat width, slots,
chunk size, job and worker tables, the exception path. The gateware
(``inagg.hdl.switch.Switch``, ``inagg.hdl.control.Control``), the RTL
runtime (``inagg.testbench.bridge.harness.BridgeHarness``) and the register
map take one, so each limit is checked here, with amaranth-soc's exact
messages, and nowhere else. A :class:`~inagg.models.job.SwitchSpec` (the
addresses and sizes every backend shares) gives its RTL geometry through
:meth:`SwitchGeometry.for_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass

from inagg.models.job import ExceptionSpec, JobSpec, Mode, SwitchSpec, check_job
from inagg.models.protocol import CHUNK_BYTES_ALLOWED, CHUNK_BYTES_DEFAULT, MAX_WORKERS
from inagg.models.regmap import MODE_CODES, RegMap

__all__ = ["WIDTHS", "MAX_PORTS", "MAX_JOB_TABLE", "SLOT_SPACE", "MAX_KICKS", "MAX_STASH", "check_width", "check_chunk_bytes", "check_slots",
           "SwitchGeometry"]

WIDTHS = (64, 256, 512)
MAX_PORTS = 64
MAX_JOB_TABLE = 64
SLOT_SPACE = 1 << 16
"""Slot numbers of the slot engine: the direct-mapped slots and the overflow slots together."""
MAX_KICKS = 1024
"""Longest kick-out chain of the exception engine."""
MAX_STASH = 64
"""Most stash entries of the exception engine (registers, searched at once)."""


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_range(value: object, low: int, high: int, what: str) -> None:
    if not _is_int(value) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer from {low} to {high}, not {value!r}")


def check_width(width: object) -> int:
    """Validate a stream data width; return it."""
    if not _is_int(width) or width not in WIDTHS:
        raise ValueError(f"Data width must be one of {WIDTHS}, not {width!r}")
    return width


def check_chunk_bytes(chunk_bytes: object) -> int:
    """Validate a chunk size (``protocol.CHUNK_BYTES_ALLOWED``); return it."""
    if not isinstance(chunk_bytes, int) or chunk_bytes not in CHUNK_BYTES_ALLOWED:
        raise ValueError(f"Chunk size must be one of {CHUNK_BYTES_ALLOWED}, not {chunk_bytes!r}")
    return chunk_bytes


def check_slots(slots: object) -> int:
    """Validate a slot count (a power of two up to 65536); return it."""
    if not isinstance(slots, int) or slots < 2 or slots & (slots - 1) or slots > SLOT_SPACE:
        raise ValueError(f"Slot count must be a power of two from 2 to {SLOT_SPACE}, not {slots!r}")
    return slots


def _check_exception_bounds(max_kicks: object, stash: object) -> None:
    _check_range(max_kicks, 0, MAX_KICKS, "Exception kick-out bound")
    _check_range(stash, 0, MAX_STASH, "Exception stash")


@dataclass(frozen=True)
class SwitchGeometry:
    """The build parameters of one RTL switch, checked once.

    Parameters
    ----------
    ports:
        Ethernet ports, 1..64.
    width:
        Beat width in bits: 64, 256 or 512.
    slots:
        Direct-mapped slots, a power of two from 2 to 65536.
    chunk_bytes:
        Payload bytes of a contribution (``SwitchSpec.chunk_bytes``).
    jobs:
        Jobs the tables hold (job numbers 0..jobs-1), 1..64.
    workers:
        Most workers per job, 1..64.
    exception:
        The exception path (``max_kicks`` up to 1024, ``stash`` up to 64,
        its overflow slots and ``slots`` within the slot engine's 65536
        numbers), or None for none: then a contribution whose slot another
        job holds is dropped (``DROP_COLLISION``).
    augmented:
        The build takes Mode III jobs besides UC and Mode II ones
        (``MODES``; ``docs/rtl.md``, "Mode III in the slot engine").

    Raises
    ------
    ValueError
        Naming the first parameter out of range, in the order above.
    TypeError
        When ``exception`` is neither an ``ExceptionSpec`` nor None.
    """

    ports: int
    width: int
    slots: int
    chunk_bytes: int = CHUNK_BYTES_DEFAULT
    jobs: int = 4
    workers: int = 8
    exception: ExceptionSpec | None = None
    augmented: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.ports) or not 1 <= self.ports <= MAX_PORTS:
            raise ValueError(f"Port count must be an integer in 1..{MAX_PORTS}, not {self.ports!r}")
        check_width(self.width)
        check_slots(self.slots)
        check_chunk_bytes(self.chunk_bytes)
        if not _is_int(self.jobs) or not 1 <= self.jobs <= MAX_JOB_TABLE:
            raise ValueError(f"Job count must be an integer in 1..{MAX_JOB_TABLE}, not {self.jobs!r}")
        if not _is_int(self.workers) or not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"Workers per job must be an integer in 1..{MAX_WORKERS}, not {self.workers!r}")
        if self.exception is not None:
            if not isinstance(self.exception, ExceptionSpec):
                raise TypeError(f"Exception path must be an ExceptionSpec or None, not {self.exception!r}")
            _check_exception_bounds(self.exception.max_kicks, self.exception.stash)
            if self.exception.capacity > SLOT_SPACE:
                raise ValueError(f"{self.exception.capacity} overflow slots exceed the slot engine's {SLOT_SPACE}")
        if not isinstance(self.augmented, bool):
            raise TypeError(f"augmented must be a bool, not {self.augmented!r}")

    @classmethod
    def from_params(cls, *, ports: int, width: int, slots: int, chunk_bytes: int = CHUNK_BYTES_DEFAULT,
                    jobs: int = 4, workers: int = 8, exc_table: int = 0, exc_max_kicks: int = 16,
                    exc_stash: int = 4, augmented: bool = False) -> "SwitchGeometry":
        """The geometry of ``Switch``'s flat keyword arguments: ``exc_table`` 0 for no exception path."""
        if not _is_int(exc_table) or exc_table != 0 and (not 2 <= exc_table <= SLOT_SPACE
                                                         or exc_table & (exc_table - 1)):
            raise ValueError(f"Exception table must be 0 (no exception path) or a power of two from 2 to {SLOT_SPACE}, "
                             f"not {exc_table!r}")
        exception = None
        if exc_table:
            _check_exception_bounds(exc_max_kicks, exc_stash)
            exception = ExceptionSpec(exc_table, exc_max_kicks, exc_stash)
        return cls(ports=ports, width=width, slots=slots, chunk_bytes=chunk_bytes, jobs=jobs, workers=workers,
                   exception=exception, augmented=augmented)

    @classmethod
    def for_spec(cls, spec: SwitchSpec, *, width: int, jobs: int = 4, workers: int = 8,
                 augmented: bool = False) -> "SwitchGeometry":
        """The RTL build of the switch ``spec`` describes, at ``width`` bits with tables of ``jobs`` x ``workers``
        (``augmented``: with Mode III)."""
        if not isinstance(spec, SwitchSpec):
            raise TypeError(f"spec must be a SwitchSpec, not {type(spec).__name__}")
        return cls(ports=spec.ports, width=width, slots=spec.slots, chunk_bytes=spec.chunk_bytes, jobs=jobs,
                   workers=workers, exception=spec.exception, augmented=augmented)

    @property
    def space(self) -> int:
        """Slot numbers of the slot engine: ``slots`` direct-mapped ones, then the overflow slots."""
        return self.slots if self.exception is None else self.slots + self.exception.capacity

    @property
    def port_bits(self) -> int:
        """Bits of a port number."""
        return max(1, (self.ports - 1).bit_length())

    @property
    def regmap(self) -> RegMap:
        """The register map of this build."""
        modes = {Mode.UC, Mode.TRANSLATED} | ({Mode.AUGMENTED} if self.augmented else set())
        return RegMap(self.jobs, self.workers, frozenset(modes))

    @property
    def geometry_value(self) -> int:
        """What the ``GEOMETRY`` register reads."""
        return RegMap.geometry(self, self.width)

    def check_job(self, job: JobSpec) -> None:
        """Raise ``ValueError`` when this build cannot hold ``job`` (:func:`~inagg.models.job.check_job`) or does
        not run it (:meth:`RegMap.check_gateware <inagg.models.regmap.RegMap.check_gateware>`)."""
        check_job(job, ports=self.ports, slots=self.slots, exception=self.exception, jobs=self.jobs,
                  workers=self.workers, modes=sorted(self.regmap.modes, key=MODE_CODES.get))
        RegMap.check_gateware(job)

"""Two-way cuckoo hash table of the switch's exception path.

Keys are 32-bit words ``job << 22 | index`` (:func:`make_key`): a job and the
index of one of its slots. Each key has one candidate position in each of two
tables of ``size`` entries; both come from one CRC-32 of the key's 4 bytes in
big-endian order (``zlib.crc32``: reflected Ethernet polynomial, initial value
and final XOR all ones)::

    h0(key) = crc & (size - 1)          -- position in table 0
    h1(key) = (crc >> 16) & (size - 1)  -- position in table 1

so ``size`` is a power of two up to 2**16 and gateware computes both with
one 32-bit-wide ``amaranth.lib.crc`` step.

Insertion first tries table 0, then table 1. When both are taken it walks a
kick-out chain -- the new key takes table 0's position, the key it displaces
moves to its position in the other table, and so on -- for at most
``max_kicks`` displacements. The walk is planned before anything is written:
only a chain that ends in a free position is applied, so a failed insertion
never loses a key. A key whose chain fails goes to the stash (``stash``
entries, searched associatively); when the stash is full too, the insertion
is refused and counted, and the table is unchanged.

Every decision is a pure function of the table's contents and the key, so
the gateware reproduces it exactly.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inagg.models.protocol import QPN_JOB_BITS

__all__ = ["make_key", "hashes", "hashes_np", "CuckooStats", "CuckooTable",
           "KEY_JOB_SHIFT", "KEY_INDEX_BITS"]

# A key is (job, slot index): the job above the index bits.
KEY_INDEX_BITS = 22
KEY_JOB_SHIFT = KEY_INDEX_BITS


def make_key(job: int, index: int) -> int:
    """The 32-bit key of slot ``index`` of ``job``."""
    if not 0 <= job < (1 << QPN_JOB_BITS):
        raise ValueError(f"job must fit {QPN_JOB_BITS} bits, not {job!r}")
    if not 0 <= index < (1 << KEY_INDEX_BITS):
        raise ValueError(f"index must fit {KEY_INDEX_BITS} bits, not {index!r}")
    return (job << KEY_JOB_SHIFT) | index


def hashes(key: int, size: int) -> tuple[int, int]:
    """(h0, h1): the key's positions in table 0 and table 1."""
    crc = zlib.crc32(key.to_bytes(4, "big"))
    return crc & (size - 1), (crc >> 16) & (size - 1)


def _crc_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0xEDB88320), t >> 1).astype(np.uint32)
    return t


_TABLE = _crc_table()


def hashes_np(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hashes` for an array of keys at once (table-driven CRC-32 in numpy)."""
    k = np.asarray(keys, np.uint32)
    crc = np.full(k.shape, 0xFFFFFFFF, np.uint32)
    for shift in (24, 16, 8, 0):  # the key's bytes, most significant first
        byte = (k >> np.uint32(shift)) & np.uint32(0xFF)
        crc = _TABLE[(crc ^ byte) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    mask = np.uint32(size - 1)
    return crc & mask, (crc >> np.uint32(16)) & mask


@dataclass
class CuckooStats:
    """Counters of the exception table (the switch exports them as registers)."""

    inserts: int = 0    # keys placed in table 0 or 1
    kicks: int = 0      # displacements applied by successful chains
    stashed: int = 0    # keys placed in the stash
    refused: int = 0    # insertions refused: chain failed and stash full
    deletes: int = 0


@dataclass
class CuckooTable:
    """Two tables of ``size`` entries and a stash; each entry maps a key to a value.

    Parameters
    ----------
    size:
        Entries per table, a power of two from 2 to 65536.
    max_kicks:
        Longest kick-out chain (displacements) an insertion may apply.
    stash:
        Entries of the stash (0 disables it).
    """

    size: int
    max_kicks: int = 16
    stash: int = 4
    tables: list[list[tuple[int, Any] | None]] = field(init=False)
    stash_entries: list[tuple[int, Any]] = field(init=False)
    stats: CuckooStats = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or not 2 <= self.size <= 65536 or self.size & (self.size - 1):
            raise ValueError(f"table size must be a power of two from 2 to 65536, not {self.size!r}")
        if not isinstance(self.max_kicks, int) or self.max_kicks < 0:
            raise ValueError(f"max_kicks must be a non-negative integer, not {self.max_kicks!r}")
        if not isinstance(self.stash, int) or self.stash < 0:
            raise ValueError(f"stash must be a non-negative integer, not {self.stash!r}")
        self.tables = [[None] * self.size, [None] * self.size]
        self.stash_entries = []
        self.stats = CuckooStats()

    @property
    def capacity(self) -> int:
        """Entries in both tables and the stash."""
        return 2 * self.size + self.stash

    def __len__(self) -> int:
        return sum(e is not None for t in self.tables for e in t) + len(self.stash_entries)

    def where(self, key: int) -> tuple[str, int] | None:
        """Where ``key`` lives: ("t0", pos), ("t1", pos), ("stash", i), or None."""
        h = hashes(key, self.size)
        for t in (0, 1):
            e = self.tables[t][h[t]]
            if e is not None and e[0] == key:
                return (f"t{t}", h[t])
        for i, (k, _) in enumerate(self.stash_entries):
            if k == key:
                return ("stash", i)
        return None

    def lookup(self, key: int) -> Any | None:
        """The value of ``key``, or None when it is absent."""
        w = self.where(key)
        if w is None:
            return None
        kind, i = w
        return self.stash_entries[i][1] if kind == "stash" else self.tables[int(kind[1])][i][1]

    def insert(self, key: int, value: Any) -> bool:
        """Add ``key``; False (and counted) when the chain fails and the stash is full.

        Raises ``KeyError`` when the key is present already: the caller looks
        up before it inserts, as the gateware does.
        """
        if self.where(key) is not None:
            raise KeyError(f"key 0x{key:08x} is in the table already")
        h = hashes(key, self.size)
        for t in (0, 1):
            if self.tables[t][h[t]] is None:
                self.tables[t][h[t]] = (key, value)
                self.stats.inserts += 1
                return True
        plan: dict[tuple[int, int], tuple[int, Any]] = {}
        cur, t = (key, value), 0
        for kick in range(1, self.max_kicks + 1):
            pos = hashes(cur[0], self.size)[t]
            victim = plan.get((t, pos), self.tables[t][pos])
            plan[(t, pos)] = cur
            cur, t = victim, 1 - t
            pos = hashes(cur[0], self.size)[t]
            if plan.get((t, pos), self.tables[t][pos]) is None:
                plan[(t, pos)] = cur
                for (pt, pp), entry in plan.items():
                    self.tables[pt][pp] = entry
                self.stats.inserts += 1
                self.stats.kicks += kick
                return True
        if len(self.stash_entries) < self.stash:
            self.stash_entries.append((key, value))
            self.stats.stashed += 1
            return True
        self.stats.refused += 1
        return False

    def delete(self, key: int) -> Any | None:
        """Remove ``key`` and return its value (None when absent)."""
        w = self.where(key)
        if w is None:
            return None
        kind, i = w
        if kind == "stash":
            _, value = self.stash_entries.pop(i)
        else:
            _, value = self.tables[int(kind[1])][i]
            self.tables[int(kind[1])][i] = None
        self.stats.deletes += 1
        return value

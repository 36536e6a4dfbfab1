"""The engine's state, read out of a simulation, as a :class:`~.reference.State` to compare with the model's."""

from __future__ import annotations

from inagg.hdl.exception import ExceptionEngine, entry_layout

from inagg.testbench.exception.reference import MODEL_STATS, State

__all__ = ["decode"]


def decode(engine: ExceptionEngine, tables: tuple[list[int], list[int]], free_list: list[int], free_first: int,
           free_count: int, stash: list[tuple[int, int]], stats: dict[str, int]) -> State:
    """Build a State from raw values: the table words, the free list memory and its first index and
    count, the stash entries in use ``(key, ptr)`` and the counters."""
    layout = entry_layout(engine.key_width, engine.capacity, engine.table)
    out_tables = []
    for words in tables:
        entries = [layout.from_bits(w) for w in words]
        out_tables.append([(int(e.key), int(e.ptr)) if e.valid else None for e in entries])
    cap = engine.capacity
    free = [free_list[(free_first + i) % cap] for i in range(free_count)]
    return State(tuple(out_tables), list(stash), free, {name: stats[name] for name in MODEL_STATS})

"""Amaranth-simulator helpers for beat streams, written once and used by every block test."""

from __future__ import annotations

import itertools

__all__ = ["frame_beats", "beats_frame", "put_frame", "get_frame", "EngineResults"]


def frame_beats(frame: bytes, width: int) -> list[tuple[int, int, int]]:
    """``frame`` as (data, keep, last) beats of ``width`` bits, byte 0 in the low bits."""
    nb = width // 8
    out = []
    for off in range(0, len(frame), nb):
        chunk = frame[off:off + nb]
        out.append((int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1, int(off + nb >= len(frame))))
    return out


def beats_frame(beats: list[tuple[int, int]], width: int) -> bytes:
    """Bytes of (data, keep) beats with packed keep."""
    nb = width // 8
    return b"".join(d.to_bytes(nb, "little")[:bin(k).count("1")] for d, k in beats)


async def put_frame(ctx, stream, frame: bytes, width: int, gaps=None) -> None:
    """Send ``frame`` on a beat stream; ``gaps`` (an iterator of 0/1) inserts idle cycles where it yields 1."""
    for data, keep, last in frame_beats(frame, width):
        while gaps is not None and next(gaps):
            ctx.set(stream.valid, 0)
            await ctx.tick()
        ctx.set(stream.valid, 1)
        ctx.set(stream.p.data, data)
        ctx.set(stream.p.keep, keep)
        ctx.set(stream.p.last, last)
        await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def get_frame(ctx, stream, width: int, pause=None, limit: int | None = None) -> bytes:
    """Receive one frame from a beat stream; ``pause`` (an iterator of 0/1) holds ready low where it yields 1.

    ``limit``: fail (``AssertionError``) when the frame's last beat has not come within that many cycles, so a
    design that never answers fails its test instead of hanging it.
    """
    beats = []
    for _ in range(limit) if limit is not None else itertools.count():
        ctx.set(stream.ready, 0 if pause is not None and next(pause) else 1)
        _, _, valid, ready, data, keep, last = await ctx.tick().sample(
            stream.valid, stream.ready, stream.p.data, stream.p.keep, stream.p.last)
        if valid and ready:
            beats.append((data, keep))
            if last:
                ctx.set(stream.ready, 0)
                return beats_frame(beats, width)
    ctx.set(stream.ready, 0)
    raise AssertionError(f"no whole frame within {limit} cycles ({len(beats)} beats of one came)")


class EngineResults:
    """The slot engine's result beats (``SlotEngine.o``) as the results the model sends: (worker, PSN, VA,
    payload) per receiver, VA at the worker's result ring slot of the chunk (``job``'s workers and
    ``chunk_bytes``), in the order the engine sends them."""

    def __init__(self, job, chunk_bytes: int, width: int):
        self._job, self._chunk, self._nb = job, chunk_bytes, width // 8
        self._beats: list[bytes] = []
        self.results: list[tuple[int, int, int, bytes]] = []

    def take(self, p) -> None:
        """One valid beat of ``o``, as sampled (``p`` its payload)."""
        self._beats.append(p.data.to_bytes(self._nb, "little"))
        if p.last:
            d = p.desc
            assert d.translated and not p.promoted
            payload = b"".join(self._beats)
            self.results.extend((v, d.psn, self._job.workers[v].result_va + d.ring * self._chunk, payload)
                                for v in (range(d.workers) if d.all else [d.worker]))
            self._beats = []

"""Amaranth-simulator helpers for beat streams, written once and used by every block test."""

from __future__ import annotations

import itertools

__all__ = ["frame_beats", "beats_frame", "put_frame", "get_frame"]


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

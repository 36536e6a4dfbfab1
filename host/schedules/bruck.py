"""Bruck's algorithms: all-gather and all-to-all in ceil(log2 n) steps for any n."""

from __future__ import annotations

import numpy as np

from inagg.host.schedules.common import check_ranks, clog
from inagg.host.schedules.ir import Buffer, Collective, Row, Schedule, ScheduleBuilder

__all__ = ["bruck"]


def bruck(nranks: int, *, collective=Collective.ALLGATHER, chunks_per_block: int = 1,
          abstract: bool = False) -> Schedule:
    """Bruck all-gather or all-to-all.

    All-gather: in step s rank r sends the ``min(2^s, n - 2^s)`` blocks it
    holds starting from its own (blocks r, r+1, ...) to rank r - 2^s. In the
    in-place layout (block j at chunk j) the blocks keep their global
    positions, so the classic final rotation disappears.

    All-to-all: rotate the send buffer into scratch so that position i holds
    the block for rank r + i; in step s send every position with bit s set
    to rank r + 2^s (it lands in the same position there); finally position
    i holds rank r - i's block for r, which a copy puts in place.
    """
    algo = "bruck"
    n = check_ranks(nranks, algo)
    coll = Collective.parse(collective)
    if coll not in (Collective.ALLGATHER, Collective.ALLTOALL):
        raise ValueError(f"bruck implements allgather and alltoall, not {coll.value}")
    if not isinstance(chunks_per_block, (int, np.integer)) or chunks_per_block < 1:
        raise ValueError(f"bruck: chunks_per_block must be a positive integer, not {chunks_per_block!r}")
    k = int(chunks_per_block)
    b = ScheduleBuilder(algo, coll, n, abstract=abstract)
    r = np.arange(n)
    lane = np.arange(k)
    steps = clog(n, 2)

    def chunks(blocks):  # (n, m) block ids -> (n, m*k) chunk ids
        return (blocks[:, :, None] * k + lane).reshape(len(blocks), -1)

    if coll is Collective.ALLGATHER:
        for s in range(steps):
            cnt = min(1 << s, n - (1 << s))
            if abstract:
                b.add_rows(Row.TRANSFER, s, r, (r - (1 << s)) % n, cnt * k)
            else:
                b.transfer(s, r, (r - (1 << s)) % n, chunks((r[:, None] + np.arange(cnt)[None, :]) % n))
        size = n * k
        return b.build(size_chunks=size, in_chunks=0, out_chunks=size)

    size = n * k
    pos = np.arange(n)
    if not abstract:
        b.copy(0, r, chunks((r[:, None] + pos[None, :]) % n), chunks(np.tile(pos, (n, 1))),
               src_buf=Buffer.INPUT, dst_buf=Buffer.SCRATCH)
    for s in range(steps):
        sel = pos[(pos >> s) & 1 == 1]
        if abstract:
            b.add_rows(Row.TRANSFER, s + 1, r, (r + (1 << s)) % n, len(sel) * k)
        else:
            blk = np.tile(sel, (n, 1))
            b.transfer(s + 1, r, (r + (1 << s)) % n, chunks(blk), src_buf=Buffer.SCRATCH, dst_buf=Buffer.SCRATCH)
    if not abstract:
        b.copy(steps + 1, r, chunks(np.tile(pos, (n, 1))), chunks((r[:, None] - pos[None, :]) % n),
               src_buf=Buffer.SCRATCH, dst_buf=Buffer.OUTPUT)
    return b.build(size_chunks=size, in_chunks=size, out_chunks=size, scratch_chunks=size, inplace=False)

"""Modes II and III in the slot engine: beats per cycle against UC frames, in simulated cycles.

    .venv/bin/python bench/translated_rtl.py          (or: python -m bench translated_rtl)

``hdl.engine.SlotEngine`` alone (Amaranth simulator) at W = 512 takes
contributions back to back, every one ready: 4 workers, chunk ``k`` of
every worker in turn (a Mode II or III frame has PSN ``k``, slot ``k mod
2W`` of a region of 2W = 8 slots; a UC frame chunk ``k``, slot ``k mod
8``). Built with Mode II (``psn_jobs=1``), with Modes II and III
(``augmented=True``) and without (UC frames only). Mode III frames run with
their ACK traffic: every child ACKs every second result as it leaves the
engine (``result_ack``), so slots come free for the PSNs ``2W`` later, and
the engine's answers are taken as they come (``reply``). The figure is
beats taken per cycle from the first beat to the last. Writes
docs/results/translated_rtl.md. Cycle figures are deterministic.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._report import head_commit, publish  # noqa: E402
from bench.promotion import engine_rate  # noqa: E402

from inagg.hdl.engine import SlotEngine  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "translated_rtl.md"
COMMAND = ".venv/bin/python bench/translated_rtl.py"
WIDTH, WORKERS, REGION, CHUNKS = 512, 4, 8, 32


def _frames(chunk_bytes: int, translated: bool, augmented: bool = False) -> list:
    nb = WIDTH // 8
    raw = np.arange(chunk_bytes // 4, dtype=">i4").tobytes()
    beats = [int.from_bytes(raw[o:o + nb], "little") for o in range(0, chunk_bytes, nb)]
    return [({"job": 0, "worker": w, "chunk": c, "slot": c % REGION, "workers": WORKERS, "slots": REGION,
              "translated": translated, "augmented": augmented, "psn": c}, beats)
            for c in range(CHUNKS) for w in range(WORKERS)]


def occupancy(chunk_bytes: int, psn_jobs: int, translated: bool, augmented: bool = False) -> tuple[float, int]:
    """Beats per cycle of the engine over ``CHUNKS`` chunks of every worker in turn; and the results sent."""
    dut = SlotEngine(WIDTH, chunk_bytes, REGION, WORKERS, psn_jobs=psn_jobs, augmented=augmented)
    return engine_rate(dut, _frames(chunk_bytes, translated))


def mode_iii_occupancy(chunk_bytes: int) -> tuple[float, int, int]:
    """As :func:`occupancy` for Mode III frames, with the children's ACKs flowing; and the ACKs and NAKs the
    engine sent (one per frame when none is refused as busy)."""
    dut = SlotEngine(WIDTH, chunk_bytes, REGION, WORKERS, psn_jobs=1, augmented=True)
    acks, replies = [], []

    async def children(ctx):
        # Every child ACKs every second result (coalesced, as a NIC does) once it has left the engine; the
        # engine's answers are taken as they come.
        ctx.set(dut.reply.ready, 1)
        offered = False
        async for _, _, ready, o_valid, o_first, psn, r_valid in ctx.tick().sample(
                dut.result_ack.ready, dut.o.valid, dut.o.p.first, dut.o.p.desc.psn, dut.reply.valid):
            if offered and ready:
                acks.pop(0)
            if o_valid and o_first and psn % 2 == 1:
                acks.extend({"job": 0, "worker": w, "psn": psn, "syndrome": 0x1F} for w in range(WORKERS))
            replies.append(r_valid)
            offered = bool(acks)
            ctx.set(dut.result_ack.valid, offered)
            if offered:
                ctx.set(dut.result_ack.p, acks[0])

    rate, results = engine_rate(dut, _frames(chunk_bytes, True, True), processes=[children])
    return rate, results, sum(replies)


def main() -> int:
    rows = []
    for chunk in (256, 1024):
        for build, psn_jobs, translated, augmented in (
                ("UC only", 0, False, False), ("with Mode II", 1, False, False), ("with Mode II", 1, True, False),
                ("with Modes II and III", 1, False, True), ("with Modes II and III", 1, True, True)):
            rate, sent = occupancy(chunk, psn_jobs, translated, augmented)
            assert sent == CHUNKS
            rows.append(f"| {chunk * 8 // WIDTH} | {build} | {'Mode II' if translated else 'UC'} | {rate:.3f} |")
        rate, sent, answered = mode_iii_occupancy(chunk)
        assert sent == CHUNKS and answered == CHUNKS * WORKERS, (sent, answered)
        rows.append(f"| {chunk * 8 // WIDTH} | with Modes II and III | Mode III, ACKs flowing | {rate:.3f} |")
    publish(OUT, [
        "# Modes II and III in the slot engine: beats per cycle",
        "",
        f"Command: `{COMMAND}` at commit {head_commit()}; Amaranth simulator, "
        f"{platform.python_implementation()} {platform.python_version()}. Cycle figures are deterministic.",
        "",
        f"`SlotEngine(width={WIDTH}, slots={REGION}, workers={WORKERS})` alone, {CHUNKS} chunks of each of "
        f"{WORKERS} workers offered back to back, every one ready (every fourth frame completes a chunk and sends "
        "its result); beats taken per cycle from the first to the last. Mode II frames carry PSN k for chunk k in "
        f"a region of 2W = {REGION} slots; the build with Mode II has `psn_jobs=1`, the one with Modes II and III "
        "`augmented=True` too. Mode III frames run with their ACK traffic: every child ACKs every second result as "
        "it leaves the engine, and the engine's answers (one ACK per frame) are taken as they come.",
        "",
        "| beats per frame | build | frames | beats/cycle |",
        "|---:|---|---|---:|",
        *rows,
        "",
        "Mode III adds no cycle either: its \"NAK sent\" bit rides in the PSN table's word, the word of "
        "`ResultAcks` is read in A beside the metadata, and the children's ACKs are walked in a block of their "
        "own, so 32 results' ACKs (128 at 4 per result, coalesced to 64) never hold a frame back; the slots of "
        "the 2W-region come free before the PSNs 2W later need them. "
        "Mode II adds no cycle: its PSN table is read with the metadata in A and written in B, and the shadow "
        "slot's read and write use the ports of a frame's second beat. The loss at 4 beats per frame is the UC "
        "engine's, the same in every row: four frames in a row to one slot wait for each other's lane writes, and "
        "a frame after one that sends a result waits until it reached the emitters (docs/rtl.md, "
        "\"Read-after-write\").",
        "",
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fast the golden models run: ICRC, aggregation, and the model switch as a software switch.

Writes docs/results/models.md. Run: ``.venv/bin/python bench/models.py``.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np

from inagg.models import arith, icrc, wire
from inagg.models.job import JobSpec, SwitchSpec, WorkerSpec
from inagg.models.protocol import Opcode
from inagg.models.switch import ModelSwitch

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "models.md"


def rate(fn, n: int) -> float:
    """Calls of ``fn`` per second, best of 3 runs of ``n`` calls."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def switch_rate(workers: int, chunks: int) -> float:
    """Contribution frames per second through ModelSwitch.receive, results built included."""
    sw = ModelSwitch(SwitchSpec(ports=8, slots=1024))
    ws = tuple(WorkerSpec(port=i % 8, mac=f"02:00:00:00:00:{i:02x}", ip=f"10.0.0.{i + 1}", qpn=0x100 + i,
                          rkey=i, result_va=0) for i in range(workers))
    job = JobSpec(job=1, rkey=0xAB, slot_base=0, slots=1024, workers=ws)
    sw.add_job(job)
    rng = np.random.default_rng(0)
    frames = [
        (ws[w].port, wire.build(eth_dst=wire.mac_bytes(sw.spec.mac), eth_src=wire.mac_bytes(ws[w].mac),
                                ip_src=wire.ip_bytes(ws[w].ip), ip_dst=wire.ip_bytes(sw.spec.ip), udp_sport=0xC000,
                                opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=job.qpn(w), psn=c, va=c * 1024,
                                rkey=job.rkey, payload=rng.integers(-1000, 1000, 256, np.int32).astype(">i4").tobytes()))
        for c in range(chunks) for w in range(workers)
    ]
    t0 = time.perf_counter()
    for port, f in frames:
        sw.receive(port, f)
    return len(frames) / (time.perf_counter() - t0)


def main() -> None:
    frame = wire.build(eth_dst=bytes(6), eth_src=bytes(6), ip_src=bytes(4), ip_dst=bytes(4), udp_sport=1,
                       opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=1, psn=0, va=0, rkey=0, payload=bytes(1024))
    body = frame[:-4]
    rows = [
        ("ICRC of a 1 KB contribution (`icrc.icrc`)", rate(lambda: icrc.icrc(body), 20000), "frames/s"),
        ("parse + check a 1 KB contribution (`wire.parse`)", rate(lambda: wire.parse(frame), 20000), "frames/s"),
        ("build a 1 KB contribution with ICRC (`wire.build`)",
         rate(lambda: wire.build(eth_dst=bytes(6), eth_src=bytes(6), ip_src=bytes(4), ip_dst=bytes(4), udp_sport=1,
                                 opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=1, psn=0, va=0, rkey=0,
                                 payload=bytes(1024)), 20000), "frames/s"),
    ]
    rows_agg = np.random.default_rng(1).integers(-2**20, 2**20, (8, 256), np.int32)
    rows.append(("`arith.aggregate` of 8 x 256 lanes", rate(lambda: arith.aggregate(rows_agg), 5000), "chunks/s"))
    for n in (2, 8, 32):
        rows.append((f"ModelSwitch, {n} workers, 1 KB chunks (contributions in)", switch_rate(n, max(64, 2048 // n)),
                     "frames/s"))
    lines = [
        "# Golden-model speed",
        "",
        "Measured with `.venv/bin/python bench/models.py` (best of 3 for the micro-benchmarks, one pass for the switch)",
        f"on {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}, one core.",
        "",
        "| what | rate | unit |",
        "|---|---:|---|",
        *[f"| {what} | {r:,.0f} | {unit} |" for what, r, unit in rows],
        "",
        "The model switch is the embedded software switch of the host library: at these rates it serves",
        "a demo of a few workers at tens of MB/s of payload. It is a reference first: every frame is parsed",
        "and checked in full and every result is built with its own ICRC.",
        "",
    ]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

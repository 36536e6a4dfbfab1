"""Jobs and contribution frames for testbenches and benchmarks, built with :func:`inagg.models.wire.build`."""

from __future__ import annotations

import numpy as np

from ..models import wire
from ..models.job import JobSpec, SwitchSpec, WorkerSpec
from ..models.protocol import Opcode

__all__ = ["make_job", "contribution", "lanes"]


def make_job(spec: SwitchSpec, job: int, workers: int, slot_base: int, slots: int, *, ports=None,
             rkey: int | None = None, psn0: int = 0) -> JobSpec:
    """A job of ``workers`` workers spread over the switch's ports (or on ``ports``, cycled)."""
    ports = list(ports) if ports is not None else list(range(spec.ports))
    ws = []
    for w in range(workers):
        host = job * 64 + w + 1
        ws.append(WorkerSpec(port=ports[w % len(ports)], mac=f"02:00:00:{job:02x}:{w:02x}:01",
                             ip=f"10.{1 + job}.{w // 250}.{1 + w % 250}", qpn=0x100000 + host * 3,
                             rkey=0x5000_0000 + host, result_va=0x7F00_0000_0000 + host * 0x100000,
                             result_psn=(psn0 + host * 997) & 0xFFFFFF))
    return JobSpec(job=job, rkey=rkey if rkey is not None else 0xC0DE_0000 + job, slot_base=slot_base,
                   slots=slots, workers=tuple(ws))


def lanes(rng: np.random.Generator, spec: SwitchSpec, bound: int = 1 << 24) -> np.ndarray:
    """Random INT32 lanes of one chunk, ``|x| < bound`` so that sums of up to 64 workers stay in INT32."""
    return rng.integers(-bound, bound, spec.lanes, dtype=np.int32)


def contribution(spec: SwitchSpec, job: JobSpec, worker: int, chunk: int, values: np.ndarray, *,
                 psn: int = 0, **overrides) -> bytes:
    """Worker ``worker``'s contribution frame for ``chunk`` of ``job``; ``overrides`` go to ``wire.build``."""
    w = job.workers[worker]
    fields = dict(eth_dst=wire.mac_bytes(spec.mac), eth_src=wire.mac_bytes(w.mac), ip_src=wire.ip_bytes(w.ip),
                  ip_dst=wire.ip_bytes(spec.ip), udp_sport=0xC000 | (w.qpn & 0x3FFF),
                  opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=job.qpn(worker), psn=psn,
                  va=(chunk % (1 << 32)) * spec.chunk_bytes, rkey=job.rkey,
                  payload=np.asarray(values, ">i4").tobytes(), pkey=spec.pkey)
    fields.update(overrides)
    return wire.build(**fields)

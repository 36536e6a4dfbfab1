"""Watched ranks (``join(..., watch=True)``): a stopped service, a lost peer or a dead service end an all-reduce
at once with a typed error, and a rank that leaves quietly tells nobody."""

import threading
import time

import numpy as np
import pytest

from inagg.host import allreduce
from inagg.host.service import PeerFailedError, SwitchClient, SwitchGoneError, SwitchService, WatchedPort, join
from inagg.host.worker import ChunkTimeoutError, ProtocolError, Timing
from inagg.models.job import SwitchSpec

SPEC = SwitchSpec(ports=4, slots=32, chunk_bytes=256)
# Without the watch, the waiting rank would time out only after about 12 s of retransmissions.
SLOW = Timing(timeout=1.0, max_timeout=2.0, tries=6)
BOUND = 2.0


def _waiting(group) -> tuple[threading.Thread, dict]:
    """Rank ``group`` all-reducing alone (its peers never join in), in a thread; the result dict gets
    ``error`` and ``at`` (when it was raised)."""
    out = {}

    def run():
        try:
            allreduce(np.ones(100, np.float32), group)
        except Exception as e:  # inspected by the test
            out["error"], out["at"] = e, time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)  # in its wait for results
    return t, out


def _job(service, workers=2):
    client = SwitchClient(service.control_address)
    ticket = client.create_job(workers, window=4)
    return client, ticket, [join(ticket, r, timing=SLOW, watch=True) for r in range(workers)]


def test_a_rank_that_aborts_fails_the_others_at_once():
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0)) as service:
        client, ticket, (g0, g1) = _job(service)
        assert isinstance(g0.port, WatchedPort)
        t, out = _waiting(g0)
        gone = time.monotonic()
        g1.port.abort()
        t.join(10)
        assert isinstance(out["error"], PeerFailedError) and isinstance(out["error"], ProtocolError)
        assert out["at"] - gone < BOUND
        assert str(out["error"]).startswith(f"rank 0 of job {ticket.job.job}: rank 1 of job {ticket.job.job} is "
                                            "gone: its control connection 127.0.0.1:")
        with pytest.raises(PeerFailedError):  # and every later wait for a frame
            g0.port.recv(0.0)
        g0.port.close()
        client.close()


def test_a_stopping_service_fails_every_waiting_rank_at_once():
    service = SwitchService(SPEC, vxlan=("127.0.0.1", 0)).start()
    client, ticket, groups = _job(service, 3)
    waiting = [_waiting(g) for g in groups[:2]]  # rank 2 never comes
    gone = time.monotonic()
    service.stop()
    for r, (t, out) in enumerate(waiting):
        t.join(10)
        assert isinstance(out["error"], SwitchGoneError) and isinstance(out["error"], ConnectionError)
        assert out["at"] - gone < BOUND
        assert str(out["error"]) == (f"rank {r} of job {ticket.job.job}: the inagg switch service is stopping "
                                     f"(service at {service.control_address[0]}:{service.control_address[1]})")
    for g in groups:
        g.port.close()
    client.close()


def test_the_owner_going_away_fails_the_ranks():
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0)) as service:
        client, ticket, (g0, g1) = _job(service)
        t, out = _waiting(g0)
        client.close()
        t.join(10)
        assert isinstance(out["error"], PeerFailedError)
        assert f"job {ticket.job.job} was torn down: its owner's control connection" in str(out["error"])
        g0.port.close()
        g1.port.close()


def test_a_rank_that_leaves_quietly_tells_nobody():
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0)) as service:
        client, ticket, (g0, g1) = _job(service)
        t = threading.Thread(target=allreduce, args=(np.ones(4, np.float32), g1))
        t.start()
        assert np.array_equal(allreduce(np.ones(4, np.float32), g0), np.full(4, 2.0, np.float32))
        t.join()
        g1.port.close()  # leaves: no event for rank 0
        g0.worker.timing = Timing(timeout=0.05, max_timeout=0.05, tries=2)
        with pytest.raises(ChunkTimeoutError):
            allreduce(np.ones(4, np.float32), g0)
        g0.port.close()
        client.close()


def test_a_service_process_that_dies_is_seen_as_the_end_of_its_connection(monkeypatch):
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0)) as service:
        client, ticket, (g0, g1) = _job(service)
        t, out = _waiting(g0)
        # What the kernel does to the connection when the service's process is killed.
        g0.port.client._sock.shutdown(2)
        t.join(10)
        assert isinstance(out["error"], SwitchGoneError)
        assert "the inagg switch service at 127.0.0.1:" in str(out["error"])
        assert str(out["error"]).endswith("is gone (the service closed the connection): it stopped or died")
        g0.port.abort()
        g1.port.close()
        client.close()

"""The switch service's limits: no control input stops it, and no one client takes it over (issue 21)."""

import json
import socket
import time

import pytest

from inagg.host.service import ServiceError, SwitchClient, SwitchService
from inagg.models.job import SwitchSpec

SPEC = SwitchSpec(ports=6, slots=32, chunk_bytes=256)


@pytest.fixture
def service():
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0)) as s:
        yield s


def limited(**limits) -> SwitchService:
    from inagg.host.service import Limits

    return SwitchService(SPEC, vxlan=("127.0.0.1", 0), limits=Limits(**limits))


def connect(service, source: str = "127.0.0.1") -> socket.socket:
    """A raw control connection from ``source`` (any 127.0.0.0/8 address is this host on Linux)."""
    s = socket.socket()
    s.settimeout(5)
    s.bind((source, 0))
    s.connect(service.control_address)
    return s


def ask(s: socket.socket, line: bytes) -> dict:
    s.sendall(line)
    return json.loads(s.makefile("rb").readline())


def closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def alive(service) -> bool:
    with SwitchClient(service.control_address, timeout=5) as c:
        return c.hello()["ok"]


# -- row 2: one line of deeply nested JSON -----------------------------------------

@pytest.mark.parametrize("line", [b"[" * 60_000, b"[" * 60_000 + b"]" * 60_000 + b"x", b"[" * 30_000 + b"]" * 30_000,
                                  b'{"op": "hello", "x": ' + b"[" * 8 + b"]" * 8 + b"}"])
def test_deeply_nested_request_is_refused_and_the_service_lives(service, line):
    with connect(service) as s:
        answer = ask(s, line + b"\n")
    assert answer == {"ok": False, "error": "a request nests at most 8 levels deep"}
    assert alive(service) and service.stats["bad_requests"] == 1


def test_brackets_inside_strings_do_not_nest(service):
    with connect(service) as s:
        assert ask(s, b'{"op": "hello", "x": "[[[[[[[[[[\\"{{{{{{{{{", "y": [[[[[[1]]]]]]}\n')["ok"]


# -- row 3: fields out of range --------------------------------------------------------

@pytest.mark.parametrize("endpoint, why", [
    (["127.0.0.1", 70000], "a UDP port is an integer in 1..65535"),
    (["127.0.0.1", 0], "a UDP port is an integer in 1..65535"),
    (["127.0.0.1", True], "a UDP port is an integer in 1..65535"),
    (["127.0.0.1", "5000"], "a UDP port is an integer in 1..65535"),
    (["127.0.0.1", 5000.0], "a UDP port is an integer in 1..65535"),
    (["0.0.0.0", 5000], "not a unicast address"),
    (["255.255.255.255", 5000], "not a unicast address"),
    (["224.0.0.1", 5000], "not a unicast address"),
    ([5, 5000], "not an IPv4 address"),
    (["127.0.0.1", 5000, 1], "a list of two"),
    ("127.0.0.1:5000", "a list of two"),
])
def test_attach_refuses_endpoints_a_datagram_cannot_go_to(service, endpoint, why):
    with SwitchClient(service.control_address) as c:
        t = c.create_job(1, window=4)
        with pytest.raises(ServiceError) as e:
            c.request("attach", key=t.token, job=t.job.job, rank=0, endpoint=endpoint)
        assert str(e.value) == (f"inagg switch service refused attach: endpoint must be [IPv4 address, UDP port], "
                                f"not {endpoint!r} ({why})")
        assert c.hello()["ok"]


def test_a_bug_in_a_request_is_answered_and_counted_not_fatal(service, monkeypatch, caplog):
    def broken(self, conn, req):
        raise OverflowError("a bug")

    monkeypatch.setitem(SwitchService._OPS, "hello", broken)
    with connect(service) as s:
        assert ask(s, b'{"op": "hello"}\n') == {"ok": False, "error": "internal error in hello (logged by the service)"}
    monkeypatch.undo()
    assert alive(service) and service.stats["internal_errors"] == 1
    assert "OverflowError: a bug" in caplog.text


# -- row 4: a client that sends and never reads ------------------------------------------

def test_a_client_that_does_not_read_is_disconnected():
    with limited(output_bytes=64 << 10) as service, socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(5)
        s.connect(service.control_address)
        sent = 0
        with pytest.raises(OSError):  # reset by the service, or blocked on a peer that no longer reads
            for _ in range(4000):
                s.sendall(b'{"op": "hello"}\n' * 100)
                sent += 100
        assert sent < 400_000 and service.stats["slow_readers"] == 1
        assert alive(service)


def test_requests_beyond_the_rate_are_refused():
    with limited(requests_per_second=10) as service, connect(service) as s:
        s.sendall(b'{"op": "hello"}\n' * 30)
        f = s.makefile("rb")
        answers = [json.loads(f.readline()) for _ in range(30)]
    assert [a["ok"] for a in answers] == [True] * 10 + [False] * 20
    assert answers[-1]["error"] == "more than 10 requests a second"
    assert service.stats["rate_limited"] == 20


# -- row 5: idle connections and one client taking every port ------------------------------

def test_connections_per_source_are_limited_and_others_still_get_in():
    with limited(connections_per_source=4) as service:
        idle = [connect(service) for _ in range(4)]
        try:
            with connect(service) as fifth:
                assert closed_by_peer(fifth)
            with connect(service, "127.0.0.2") as other:
                assert ask(other, b'{"op": "hello"}\n')["ok"]
        finally:
            for s in idle:
                s.close()
        assert service.stats["connections_refused"] == 1


def test_idle_connections_without_jobs_are_closed():
    with limited(idle_timeout=0.2) as service, connect(service) as idle, SwitchClient(service.control_address) as owner:
        t = owner.create_job(1, window=4)
        start = time.monotonic()
        assert closed_by_peer(idle)
        assert time.monotonic() - start < 2
        time.sleep(0.8)
        assert owner.counters(t.job.job, t.token)["ok"]  # a job's owner may idle for a whole training run
    assert service.stats["idle_closed"] == 1


def test_jobs_and_ports_per_source_are_limited():
    with limited(jobs_per_source=2, ports_per_source=3) as service:
        with connect(service) as a, connect(service, "127.0.0.2") as b:
            assert ask(a, b'{"op": "create_job", "workers": 2, "window": 4}\n')["ok"]
            assert ask(a, b'{"op": "create_job", "workers": 2, "window": 4}\n') == {
                "ok": False, "error": "127.0.0.1 holds 2 switch ports; 2 more exceed its quota of 3"}
            assert ask(a, b'{"op": "create_job", "workers": 1, "window": 4}\n')["ok"]
            assert ask(a, b'{"op": "create_job", "workers": 1, "window": 4}\n') == {
                "ok": False, "error": "127.0.0.1 owns 2 jobs already, its quota"}
            assert ask(b, b'{"op": "create_job", "workers": 3, "window": 4}\n')["ok"]


@pytest.mark.parametrize("limits, error", [
    ({"idle_timeout": 0}, "limit idle_timeout must be a positive number, not 0"),
    ({"connections": True}, "limit connections must be a positive number, not True"),
])
def test_limits_are_validated(limits, error):
    from inagg.host.service import Limits

    with pytest.raises(ValueError, match=f"^{error}$"):
        Limits(**limits)


def test_the_limits_table_of_the_docs_is_the_limits_dataclass():
    import dataclasses
    import pathlib
    import re

    from inagg.host.service import Limits

    text = (pathlib.Path(__file__).parents[2] / "docs" / "scaleout.md").read_text()
    rows = re.findall(r"^\| `--([a-z-]+)` \| ([0-9.]+) \|", text, re.M)
    assert rows == [(f.name.replace("_", "-"), str(f.default)) for f in dataclasses.fields(Limits)]

"""The switch service: its control protocol, job isolation, and clients in other processes."""

import json
import socket
import threading
import time

import numpy as np
import pytest

from inagg.host import allreduce
from inagg.host.service import (
    ENV_RANK, ENV_SWITCH, ENV_TICKET, ServiceError, SwitchClient, SwitchService, SwitchUnavailableError, Ticket,
    group_from_env, join, parse_address,
)
from inagg.host.collectives import reference
from inagg.host.link import Faults
from inagg.host.vxlan import VxlanPort, encap
from inagg.host.worker import ChunkTimeoutError, Timing
from inagg.models.job import Mode, SwitchSpec
from inagg.models.switch import ModelSwitch

SPEC = SwitchSpec(ports=6, slots=32, chunk_bytes=256)


@pytest.fixture
def service():
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0)) as s:
        yield s


def raw(service, line: bytes) -> dict:
    with socket.create_connection(service.control_address, timeout=5) as s:
        s.sendall(line)
        return json.loads(s.makefile().readline())


def test_hello_describes_the_service(service):
    with SwitchClient(service.control_address) as c:
        h = c.hello()
    assert h["vxlan"] == list(service.vxlan_address) and h["vni"] == 1 and h["free_ports"] == 6
    assert h["switch"]["ports"] == 6 and h["switch"]["chunk_bytes"] == 256 and h["jobs"] == 0


@pytest.mark.parametrize("line, error", [
    (b"not json\n", "a request is one JSON object per line"),
    (b"[1, 2]\n", "a request is one JSON object per line"),
    (b'{"op": "reboot"}\n', "unknown op 'reboot'; known: attach, counters, create_job, hello, remove_job, switch_counters"),
    (b'{"op": "create_job", "workers": 0}\n', "workers must be an integer in 1..64, not 0"),
    (b'{"op": "create_job", "workers": 7, "window": 4}\n', "a job of 7 workers needs 7 free switch ports; 6 of 6 are free"),
    (b'{"op": "create_job", "workers": 2, "window": 3}\n', "window must be a power of two, not 3"),
    (b'{"op": "create_job", "workers": 2, "window": 32}\n', "window must be an integer in 1..16, not 32"),
    (b'{"op": "create_job", "workers": 2, "window": 4, "mode": "IV"}\n', "mode must be one of uc, I, II, III, not 'IV'"),
    (b'{"op": "create_job", "workers": 2, "window": 4, "mode": ["II"]}\n', "mode must be one of uc, I, II, III, not ['II']"),
    (b'{"op": "counters", "job": 5, "token": "x"}\n', "job 5 is not configured"),
    (b'{"op": "remove_job", "job": "1"}\n', "job must be an integer in 0..1023, not '1'"),
])
def test_bad_requests_get_exact_errors(service, line, error):
    assert raw(service, line) == {"ok": False, "error": error}


def test_oversized_request_is_refused_and_the_connection_closed(service):
    with socket.create_connection(service.control_address, timeout=5) as s:
        s.sendall(b"x" * (70 << 10))
        f = s.makefile("rb")
        assert json.loads(f.readline()) == {"ok": False, "error": "request longer than 65536 bytes"}
        assert f.readline() == b""


def test_slot_regions_and_ports_are_disjoint_and_freed(service):
    with SwitchClient(service.control_address) as a, SwitchClient(service.control_address) as b:
        t1 = a.create_job(2, window=8)
        t2 = b.create_job(3, window=4)
        with pytest.raises(ServiceError, match="no free region of 16 slots"):
            b.create_job(1, window=8)
        assert {w.port for w in t1.job.workers}.isdisjoint(w.port for w in t2.job.workers)
        assert t1.job.slot_base + t1.job.slots <= t2.job.slot_base or t2.job.slot_base + t2.job.slots <= t1.job.slot_base
        assert t1.job.rkey != t2.job.rkey and t1.token != t2.token
        b.remove_job(t2.job.job, t2.token)
        assert b.create_job(3, window=4).job.workers[0].port == t2.job.workers[0].port
    time.sleep(0.1)  # the owners' connections closed: their jobs go
    with SwitchClient(service.control_address) as c:
        assert c.hello()["jobs"] == 0


def test_attach_checks_rank_endpoint_and_binding(service):
    with SwitchClient(service.control_address) as c:
        t = c.create_job(2, window=4)
        p, q = VxlanPort(t.vxlan, 1), VxlanPort(t.vxlan, 1)  # where probes come from
        with pytest.raises(ServiceError, match=r"rank must be an integer in 0..1, not 2"):
            c.attach(t, 2, p.address, receive=p.recv)
        with pytest.raises(ServiceError, match=r"endpoint must be \[IPv4 address, UDP port\], not \['nowhere', 1\]"):
            c.attach(t, 0, ("nowhere", 1))
        assert c.attach(t, 0, p.address, receive=p.recv) == t.job  # the first incarnation: the ticket's
        with pytest.raises(ServiceError, match=rf"endpoint {p.address[0]}:{p.address[1]} is attached to switch port "
                                               rf"{t.job.workers[0].port} already"):
            c.attach(t, 1, p.address, receive=p.recv)
        assert c.attach(t, 0, q.address, receive=q.recv) == t.job  # a rank may move
        assert c.attach(t, 0, q.address) == t.job  # attached there already: no new proof
        p.close()
        q.close()


def test_datagrams_from_unattached_endpoints_or_other_fabrics_are_counted(service):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(encap(b"\0" * 60, 1), service.vxlan_address)
        s.sendto(encap(b"\0" * 60, 2), service.vxlan_address)
        s.sendto(b"\0" * 60, service.vxlan_address)
        deadline = time.monotonic() + 5
        while len(stats := dict(service.stats)) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert stats == {"rx_datagrams": 3, "unbound_source": 1, "wrong_vni": 1, "not_vxlan": 1}


def test_client_errors_name_the_address(monkeypatch, service):
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    with pytest.raises(SwitchUnavailableError, match=f"no switch service address: pass one or set {ENV_SWITCH}"):
        SwitchClient()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    host, port = s.getsockname()
    s.close()
    with pytest.raises(SwitchUnavailableError, match=f"cannot reach the inagg switch service at {host}:{port}"):
        SwitchClient(f"{host}:{port}")
    monkeypatch.setenv(ENV_SWITCH, "%s:%d" % service.control_address)
    with SwitchClient() as c:
        assert c.hello()["ok"]


@pytest.mark.parametrize("text", ["host", ":1", "h:", "h:x", "h:65536"])
def test_parse_address_refuses(text):
    with pytest.raises(ValueError, match=rf"^address must be HOST:PORT with a port in 0..65535, not {text!r}$"):
        parse_address(text)


def test_ticket_round_trips_and_refuses_junk(service):
    with SwitchClient(service.control_address) as c:
        t = c.create_job(2, window=4)
    assert Ticket.from_json(t.to_json()) == t
    with pytest.raises(ValueError, match="^not an inagg job ticket: "):
        Ticket.from_json('{"switch": {}}')


def test_group_from_env_joins_and_sums(monkeypatch, service):
    with SwitchClient(service.control_address) as c:
        t = c.create_job(1, window=4)
        monkeypatch.setenv(ENV_TICKET, t.to_json())
        monkeypatch.setenv(ENV_RANK, "0")
        g = group_from_env()
        try:
            assert np.array_equal(allreduce(np.arange(100, dtype=np.float32), g), np.arange(100, dtype=np.float32))
        finally:
            g.port.close()
    monkeypatch.delenv(ENV_TICKET)
    with pytest.raises(SwitchUnavailableError, match=f"set {ENV_TICKET} .* and {ENV_RANK} to join a job"):
        group_from_env()


def test_a_stopped_service_fails_the_allreduce_with_a_clear_error():
    service = SwitchService(SPEC, vxlan=("127.0.0.1", 0)).start()
    client = SwitchClient(service.control_address)
    t = client.create_job(1, window=4)
    g = join(t, 0, timing=Timing(timeout=0.01, max_timeout=0.01, tries=3))
    service.stop()
    with pytest.raises(ChunkTimeoutError, match=f"job {t.job.job} worker 0: no result for chunk 0 after 3 tries"):
        allreduce(np.ones(10, np.float32), g)
    assert g.port.stats["unreachable"] >= 1
    g.port.close()
    client.close()


def test_the_default_fast_switch_refuses_an_rc_job(service):
    with SwitchClient(service.control_address) as c, pytest.raises(ServiceError, match="implements UC"):
        c.create_job(2, window=4, mode=Mode.AUGMENTED)


@pytest.mark.parametrize("mode", [Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED], ids=["I", "II", "III"])
def test_rc_modes_through_the_service_with_loss(mode):
    """Ranks over VXLAN in Modes I, II and III: the service runs the model switch's timers in real time."""
    sw = ModelSwitch(SPEC, hop_timeout=0.05)
    rng = np.random.default_rng(4)
    data = [rng.standard_normal(500).astype(np.float32) for _ in range(3)]
    out, errors = {}, {}
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0), switch=sw, faults=Faults(loss=0.2, dup=0.05), seed=3) as s, \
            SwitchClient(s.control_address) as c:
        t = c.create_job(3, window=4, mode=mode)
        groups = [join(t, r, timing=Timing(timeout=0.05, max_timeout=0.05, tries=20)) for r in range(3)]

        def rank(r):
            try:
                out[r] = (allreduce(data[r], groups[r]), groups[r].last_exponent)
            except Exception as e:  # collected for the test to inspect
                errors[r] = e

        threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        for g in groups:
            g.close()
            g.port.close()
    assert not errors and len(out) == 3
    want = reference("allreduce", data, exponent=out[0][1])[0]
    assert all(np.array_equal(v.view(np.uint32), want.view(np.uint32)) for v, _ in out.values())


# -- clients in other processes -------------------------------------------------

def test_two_client_processes_two_jobs_and_a_wrong_token(two_clients):
    """`inagg switch serve` as a process; job A's owner, and a second client that tries to touch job A."""
    run = two_clients(["switch", "serve", "--ports", "4", "--slots", "64", "--chunk-bytes", "256"],
                      absent_worker=9, start_wait=30, answer_wait=30, count_wait=5)
    assert "inagg.switch INFO stopped: " in run.log and "refused_requests': 3" in run.log


def test_service_parameters_are_validated():
    with pytest.raises(TypeError, match="^spec must be a SwitchSpec, not dict$"):
        SwitchService({})
    with pytest.raises(ValueError, match=r"^a switch service has at most 253 ports \(one /24 of worker addresses "
                                         r"beside the switch\), not 254$"):
        SwitchService(SwitchSpec(ports=254))
    with pytest.raises(ValueError, match=r"^VNI must be an integer in 0..16777215, not 16777216$"):
        SwitchService(SPEC, vni=1 << 24)


@pytest.mark.parametrize("argv, error", [
    (["--listen", "nowhere"], "argument --listen: address must be HOST:PORT with a port in 0..65535, not 'nowhere'"),
    (["--listen", "127.0.0.1:0", "--ports", "254"], "argument --ports: expected an integer in 1..253, not '254'"),
    (["--listen", "127.0.0.1:0", "--loss", "1"], "argument --loss: a rate is a number in [0, 1), not '1'"),
    (["--listen", "127.0.0.1:0", "--slots", "3"], "slots must be a power of two >= 2, not 3"),
    (["--listen", "127.0.0.1:0", "--idle-timeout", "0"], "argument --idle-timeout: expected a positive float, not '0'"),
    (["--listen", "127.0.0.1:0", "--hop-timeout", "-1"], "argument --hop-timeout: expected a positive float, not '-1'"),
    (["--listen", "127.0.0.1:0", "--hop-timeout", "0.01"], "--hop-timeout is an option of --backend model"),
    (["--listen", "127.0.0.1:0", "--jobs-per-source", "2.5"],
     "argument --jobs-per-source: expected a positive int, not '2.5'"),
    (["--listen", "127.0.0.1:0", "--admin-token-file", "/nonexistent/token"],
     "cannot read the admin token: [Errno 2] No such file or directory: '/nonexistent/token'"),
    (["--listen", "127.0.0.1:0", "--admin-token-file", "/dev/null"],
     "the admin token on the first line of /dev/null must have at least 16 characters"),
])
def test_serve_refuses_bad_arguments(capsys, argv, error):
    from inagg.cli import main

    try:
        rc = main(["switch", "serve", *argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    assert rc == 2 and error in capsys.readouterr().err


def test_serve_reports_a_port_in_use(capsys):
    from inagg.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        host, port = s.getsockname()
        assert main(["switch", "serve", "--listen", f"{host}:{port}", "--vxlan", "127.0.0.1:0"]) == 1
    assert "inagg switch serve: error: cannot listen: [Errno 98] Address already in use" in capsys.readouterr().err


def test_a_ticket_carries_every_job_field_through_json():
    """Mode, collective, root, subswitches and the uplink survive the ticket's JSON (a tree's switch job)."""
    import dataclasses

    from inagg.host.controller import plan_tree
    from inagg.host.service import _job_dict, _job_from
    from inagg.models.job import Mode

    tp = plan_tree("2x2", collective="reduce", root=1)
    for job in (j for p in tp.plans for j in p.jobs):
        assert _job_from(json.loads(json.dumps(_job_dict(job)))) == job
    uc = plan_tree("2", collective="allreduce").plans[0].jobs[0]
    rc = dataclasses.replace(uc, mode=Mode.AUGMENTED)
    assert _job_from(json.loads(json.dumps(_job_dict(rc)))) == rc


def test_two_services_started_without_vxlan_options_share_a_host(tmp_path):
    """The VXLAN port defaults to 0 (any free one), so a second service, or a kernel VXLAN device on 4789, does
    not stop the first; the log says which port each took."""
    import re
    import subprocess
    import sys

    procs, ports = [], []
    try:
        for k in range(2):
            log = tmp_path / f"serve{k}.err"
            with open(log, "wb") as err:
                procs.append(subprocess.Popen([sys.executable, "-m", "inagg.cli", "switch", "serve", "--listen",
                                               "127.0.0.1:0"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=err))
            deadline = time.monotonic() + 60
            while not (m := re.search(r"listening: control 127\.0\.0\.1:\d+, vxlan 127\.0\.0\.1:(\d+)",
                                      log.read_text())):
                assert procs[-1].poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            ports.append(int(m.group(1)))
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    assert len(set(ports)) == 2 and 4789 not in ports, ports

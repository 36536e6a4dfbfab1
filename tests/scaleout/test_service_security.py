"""Issue 21's attacks on the switch service, one test each: incarnations, endpoint binding, the reflector."""

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from inagg.host import allreduce
from inagg.host.api import Group
from inagg.host.roce import contribution
from inagg.host.service import (ENV_RANK, ENV_TICKET, ENV_TLS_CA, PeerFailedError, ServiceError, SwitchClient,
                                SwitchService, SwitchUnavailableError, _mac, join, tls_server_context)
from inagg.host.worker import ChunkTimeoutError, Timing
from inagg.host.vxlan import VxlanPort
from inagg.testbench.traffic import contribution as frame_with
from inagg.models.job import SwitchSpec

SPEC = SwitchSpec(ports=6, slots=32, chunk_bytes=256)  # 64 lanes a chunk
# Short enough that a stall fails the test in seconds, long enough for loopback.
QUICK = Timing(timeout=0.05, max_timeout=0.5, tries=12)


def _allreduce_all(groups, data):
    """Every rank's all-reduce of its array at once, one thread each: its sum, or the exception it raised."""
    out = [None] * len(groups)

    def rank(r):
        try:
            out[r] = allreduce(data[r], groups[r])
        except Exception as e:  # the caller inspects it
            out[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(groups))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return out


def _run(ticket, data):
    """One run of a training script: every rank joins ``ticket`` afresh, all-reduces its array, leaves."""
    groups = [join(ticket, r, timing=QUICK) for r in range(len(data))]
    out = _allreduce_all(groups, data)
    for g in groups:
        g.port.close()
    return out


def test_a_restarted_run_never_gets_the_old_runs_sums():
    """Row 1: joining again with the same ticket starts a new incarnation, on fresh slots, short run or long."""
    rng = np.random.default_rng(1)
    with SwitchService(SPEC) as service, SwitchClient(service.control_address) as owner:
        ticket = owner.create_job(2, window=4)  # R = 8 slots
        for lanes in (3 * 64, 3 * 64, 20 * 64):  # the same chunks again, then more than R chunks
            data = [rng.integers(-99, 99, lanes).astype(np.float32) for _ in range(2)]
            for got in _run(ticket, data):
                assert isinstance(got, np.ndarray), got
                np.testing.assert_array_equal(got, data[0] + data[1])


def test_a_new_incarnation_tells_the_old_runs_watching_ranks_and_keeps_moves_in_one():
    with SwitchService(SPEC) as service, SwitchClient(service.control_address) as owner:
        ticket = owner.create_job(2, window=4)
        old = join(ticket, 0, timing=QUICK, watch=True)
        with VxlanPort(ticket.vxlan, 1) as moved:
            assert old.port.client.attach(ticket, 0, moved.address, watch=True, receive=moved.recv) == ticket.job
        new = join(ticket, 0, timing=QUICK)  # another client: a new run
        assert new.job.job != ticket.job.job and new.job.rkey != ticket.job.rkey
        assert [w.port for w in new.job.workers] == [w.port for w in ticket.job.workers]
        with pytest.raises(PeerFailedError, match=rf"rank 0 of job {ticket.job.job} joined again from a new run: "
                                                  "incarnation 2 replaces this one"):
            old.port.recv(1.0)
        old.port.close()
        new.port.close()


def test_a_worker_contributes_only_as_the_rank_its_endpoint_attached_as():
    """Row 6: another rank's QPN from a rank's own endpoint, and another job's QPN with its leaked R_Key, are
    dropped by the service (``foreign_qpn``) before the switch sees them; the victim's sums stay exact."""
    with SwitchService(SPEC) as service, SwitchClient(service.control_address) as owner:
        a = owner.create_job(2, window=4)
        b = owner.create_job(1, window=4)
        ga = [join(a, r, timing=QUICK) for r in range(2)]
        gb = join(b, 0, timing=QUICK)
        evil = np.full(SPEC.lanes, 1000, ">i4").tobytes()
        for chunk in range(4):
            ga[1].port.send(bytes(contribution(a.switch, ga[0].job, 0, chunk, evil)))  # as rank 0 of its own job
            gb.port.send(bytes(contribution(a.switch, ga[0].job, 1, chunk, evil)))     # as job A's rank 1
        data = [np.full(4 * SPEC.lanes, 1, np.float32), np.full(4 * SPEC.lanes, 2, np.float32)]
        for got in _allreduce_all(ga, data):
            np.testing.assert_array_equal(got, np.full(4 * SPEC.lanes, 3, np.float32))
        assert service.stats["foreign_qpn"] == 8
        for g in ga + [gb]:
            g.port.close()


def test_a_timeout_from_slot_rule_drops_names_them():
    """Row 9: a rank that starts again at chunk 0 within the same run (no new incarnation) meets slots that moved
    on; its ChunkTimeoutError names DROP_STALE, read from the switch's counters, not an unreachable switch."""
    with SwitchService(SPEC) as service, SwitchClient(service.control_address) as owner:
        ticket = owner.create_job(2, window=4)  # R = 8 slots
        groups = [join(ticket, r, timing=QUICK) for r in range(2)]
        data = [np.ones(20 * SPEC.lanes, np.float32)] * 2
        assert all(isinstance(got, np.ndarray) for got in _allreduce_all(groups, data))
        again = Group(ticket.switch, groups[1].job, 1, groups[1].port, timing=Timing(0.02, max_timeout=0.02, tries=3))
        again.diagnose = groups[1].diagnose
        with pytest.raises(ChunkTimeoutError, match=r"job \d+ worker 1: no result for chunk 0 after 3 tries \(the "
                           r"switch dropped \d+ contributions as DROP_STALE \(older than the chunk its slot holds\) "
                           r"of this job since this rank joined: do the ranks agree on the chunk sequence"):
            allreduce(np.ones(SPEC.lanes, np.float32), again)
        for g in groups:
            g.port.close()


def test_an_endpoint_is_bound_only_after_it_proved_it_receives():
    """Row 8: attaching a rank to a third party's address fails: the third party gets a few probes (no
    amplification), never a result; a wrong proof is refused and counted."""
    with SwitchService(SPEC) as service, SwitchClient(service.control_address, timeout=0.6) as c, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as victim:
        victim.bind(("127.0.0.1", 0))
        t = c.create_job(1, window=4)
        with pytest.raises(ServiceError, match=r"endpoint 127.0.0.1:\d+ got none of 3 proofs of receipt"):
            c.attach(t, 0, victim.getsockname(), receive=lambda timeout: time.sleep(timeout))
        with pytest.raises(ServiceError, match="did not prove it receives"):
            c.request("attach", key=t.token, job=t.job.job, rank=0, endpoint=list(victim.getsockname()),
                      session=c.session, proof="0" * 32)
        victim.settimeout(0.2)
        probes = []
        with contextlib.suppress(TimeoutError):
            while True:
                probes.append(victim.recv(2048))
        assert len(probes) == 3 and all(len(p) < 80 for p in probes)
        assert service.stats["probes_sent"] == 3 and service.stats["proofs_refused"] == 1
        assert service.vxlan_address not in service._port_of and not service._endpoint_of


ADMIN = "an admin token of the operator's"


def test_create_job_needs_the_admin_token_and_the_job_key_never_crosses_the_wire():
    seen = []
    with SwitchService(SPEC, admin_token=ADMIN) as service:
        with SwitchClient(service.control_address, admin_token="") as anonymous, \
                pytest.raises(ServiceError, match=r"refused create_job: create_job: the request is not signed"):
            anonymous.create_job(1, window=4)
        with SwitchClient(service.control_address, admin_token="not the admin's token") as wrong, \
                pytest.raises(ServiceError, match=r"refused create_job: create_job: wrong signature"):
            wrong.create_job(1, window=4)
        with SwitchClient(service.control_address, admin_token=ADMIN) as admin:
            admin._sock = _Tap(admin._sock, seen)
            t = admin.create_job(1, window=4)
            assert admin.counters(t.job.job, t.token)["ok"]
        assert service.stats["refused_requests"] == 2
    assert t.token not in b"".join(seen).decode() and ADMIN not in b"".join(seen).decode()


class _Tap:
    """A socket that records every byte both ways."""

    def __init__(self, sock, seen):
        self._sock, self._seen = sock, seen

    def sendall(self, data):
        self._seen.append(bytes(data))
        return self._sock.sendall(data)

    def recv(self, n):
        data = self._sock.recv(n)
        self._seen.append(data)
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


def test_signed_requests_cannot_be_replayed_or_altered():
    """Row 7: a job request is signed with the job's key over the connection's nonce and a rising seq; a copy
    sent again, or on another connection, or with a field changed, is refused."""
    with SwitchService(SPEC) as service, SwitchClient(service.control_address) as owner:
        t = owner.create_job(1, window=4)
        sent = []
        owner._sock = _Tap(owner._sock, sent)
        owner.counters(t.job.job, t.token)
        signed = next(json.loads(x) for x in sent if b'"op": "counters"' in x)
        assert "token" not in signed and t.token not in json.dumps(signed)

        def raw(sock_owner, body):
            sock_owner._sock.sendall(json.dumps(body).encode() + b"\n")
            return sock_owner._line(5.0)

        assert raw(owner, signed)["error"].endswith("is not above the connection's last, 1 (a replay?)")
        with SwitchClient(service.control_address) as other:
            other.hello()
            assert raw(other, signed)["error"] == f"job {t.job.job}: wrong signature"  # another connection's nonce
        assert raw(owner, {**signed, "seq": 2})["error"] == f"job {t.job.job}: wrong signature"  # altered
        assert raw(owner, {**signed, "op": "remove_job"})["error"] == f"job {t.job.job}: wrong signature"
        assert owner.hello()["jobs"] == 1


def test_a_jobs_counters_are_its_own_and_the_switch_wide_ones_the_admins():
    """Issue 21: a job's token reads that job's counts only, not its co-tenants' traffic; another job's token reads
    nothing of it; the switch-wide counters need the admin token."""
    with SwitchService(SPEC, admin_token=ADMIN) as service, SwitchClient(service.control_address,
                                                                         admin_token=ADMIN) as admin:
        a, b = admin.create_job(2, window=4), admin.create_job(1, window=4)
        ga = [join(a, r, timing=QUICK) for r in range(2)]
        gb = join(b, 0, timing=QUICK)
        data = [np.ones(3 * SPEC.lanes, np.float32)] * 2
        assert all(isinstance(got, np.ndarray) for got in _allreduce_all(ga, data))
        np.testing.assert_array_equal(allreduce(np.ones(SPEC.lanes, np.float32), gb), np.ones(SPEC.lanes))
        mine_a, mine_b = admin.counters(a.job.job, a.token), admin.counters(b.job.job, b.token)
        whole = admin.switch_counters()
        for name, n in whole["switch"].items():  # every frame counts in the job whose port it came in on
            assert mine_a["switch"][name] + mine_b["switch"][name] == n, name
        assert 0 < mine_b["switch"]["COMPLETED"] < mine_a["switch"]["COMPLETED"]
        for name in ("rx_datagrams", "tx_datagrams"):
            assert 0 < mine_b["service"][name] < mine_a["service"][name]
            assert mine_a["service"][name] + mine_b["service"][name] == whole["service"][name]
        with pytest.raises(ServiceError, match=rf"refused counters: job {a.job.job}: wrong signature"):
            admin.counters(a.job.job, b.token)
        with SwitchClient(service.control_address, admin_token=b.token) as tenant, \
                pytest.raises(ServiceError, match=r"refused switch_counters: switch_counters: wrong signature"):
            tenant.switch_counters()
        for g in ga + [gb]:
            g.port.close()
    with SwitchService(SPEC) as open_service, SwitchClient(open_service.control_address, admin_token="x" * 16) as c, \
            pytest.raises(ServiceError, match=r"this service has no admin token \(--admin-token-file\): its "
                                              r"switch-wide counters are in its log only"):
        c.switch_counters()


class _Proxy:
    """A TCP hop between one client and the service that can slip lines of its own to the client (on the path)."""

    def __init__(self, target):
        self._listen = socket.create_server(("127.0.0.1", 0))
        self.address = self._listen.getsockname()
        self._target, self._client = target, None
        self.seen = []  # every byte that crossed, both ways
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        self._client, _ = self._listen.accept()
        upstream = socket.create_connection(self._target)
        self._ready.set()
        for a, b in ((self._client, upstream), (upstream, self._client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a, b):
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                self.seen.append(data)
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def inject(self, event: dict):
        self._ready.wait(5)
        self._client.sendall(json.dumps(event).encode() + b"\n")


def test_a_forged_or_replayed_event_does_not_end_a_watching_rank():
    """Issue 21: the events pushed to a watching rank are signed like answers; one on the path who forges an event
    (unsigned, under another key, or an old seq again) does not end the rank, whose job goes on; a real one does."""
    with SwitchService(SPEC) as service, SwitchClient(service.control_address) as owner:
        t = owner.create_job(2, window=4)
        proxy = _Proxy(service.control_address)
        g0 = join(dataclasses.replace(t, control=proxy.address), 0, timing=QUICK, watch=True)
        g1 = join(t, 1, timing=QUICK)
        client, job = g0.port.client, t.job.job
        forged = {"event": "job_removed", "job": job, "reason": "forged", "seq": 1 << 40}
        proxy.inject(forged)
        proxy.inject({**forged, "mac": _mac("f" * 32, client._nonce, "event", forged)})
        old = {**forged, "seq": 0}  # signed under the job's key, but no later than the last event
        proxy.inject({**old, "mac": _mac(t.token, client._nonce, "event", old)})
        time.sleep(0.2)
        data = [np.full(3 * SPEC.lanes, 1, np.float32), np.full(3 * SPEC.lanes, 2, np.float32)]
        for got in _allreduce_all([g0, g1], data):
            np.testing.assert_array_equal(got, np.full(3 * SPEC.lanes, 3, np.float32))
        assert g0.port.failure is None and g0.port.stats["refused_events"] == 3
        owner.remove_job(job, t.token)
        with pytest.raises(PeerFailedError, match=rf"job {job} was torn down: removed by"):
            g0.port.recv(5.0)
        g0.port.close()
        g1.port.close()


FLOOD = r"""
import sys
from inagg.host.roce import contribution
from inagg.host.service import group_from_env
g = group_from_env()
frames = [bytes(contribution(g.switch, g.job, 0, c, bytes(g.switch.chunk_bytes))) for c in range(4 * g.job.slots)]
print("ready", flush=True)
while True:
    for f in frames:
        g.port.send(f)
"""


def test_a_co_tenant_all_reduces_while_another_job_floods():
    """Row 9: a job flooding valid contributions of its own from another process gets its share of the data plane:
    a co-tenant's all-reduces complete, exact, and the flood's excess is dropped and counted in the flood's job."""
    spec = SwitchSpec(ports=4, slots=256, chunk_bytes=256)
    with SwitchService(spec) as service, SwitchClient(service.control_address) as owner:
        victim, flood = owner.create_job(2, window=16), owner.create_job(1, window=16)
        groups = [join(victim, r) for r in range(2)]
        p = subprocess.Popen([sys.executable, "-c", FLOOD], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, ENV_TICKET: flood.to_json(), ENV_RANK: "0"})
        try:
            assert p.stdout.readline().strip() == "ready"
            time.sleep(0.5)  # the flood fills the socket buffers
            data = [np.arange(64 * spec.lanes, dtype=np.float32) * (r + 1) for r in range(2)]
            for _ in range(3):
                for got in _allreduce_all(groups, data):
                    np.testing.assert_array_equal(got, data[0] + data[1])
            counts = owner.counters(flood.job.job, flood.token)["service"]
        finally:
            p.kill()
            p.wait()
        assert counts["rx_datagrams"] > 0 and counts["socket_drops"] + counts.get("fair_share_drops", 0) > 0
        for g in groups:
            g.port.close()


def test_each_rank_has_its_own_r_key_and_no_other_ranks_key_opens_the_job():
    """Issue 21: the service gives every rank a contribution R_Key of its own (fresh in every incarnation); a key
    read off one rank's frames does not let another rank's frames through, even from that rank's own endpoint."""
    with SwitchService(SPEC) as service, SwitchClient(service.control_address) as owner:
        t = owner.create_job(2, window=4)
        keys = [t.job.contrib_rkey(r) for r in range(2)]
        assert len({*keys, t.job.rkey}) == 3
        groups = [join(t, r, timing=QUICK) for r in range(2)]
        for chunk in range(4):  # rank 1's own QPN, from its own endpoint, with rank 0's key
            groups[1].port.send(frame_with(t.switch, t.job, 1, chunk, np.full(SPEC.lanes, 1000), rkey=keys[0]))
        data = [np.full(4 * SPEC.lanes, 1, np.float32), np.full(4 * SPEC.lanes, 2, np.float32)]
        for got in _allreduce_all(groups, data):
            np.testing.assert_array_equal(got, np.full(4 * SPEC.lanes, 3, np.float32))
        assert owner.counters(t.job.job, t.token)["switch"]["DROP_BAD_RKEY"] == 4
        for g in groups:
            g.port.close()


def _certificate(folder) -> tuple[str, str, str]:
    """A CA and a certificate it signed for 127.0.0.1, made with the openssl tool: (ca, cert, key) PEM files."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (apt-get install openssl): no test certificate")
    ca, ca_key, cert, key, csr, ext = (str(folder / n) for n in ("ca.pem", "ca.key", "cert.pem", "key.pem",
                                                                  "cert.csr", "ext.cnf"))
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                                    "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    for cmd in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "1",
                 "-subj", "/CN=inagg test CA"],
                ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
                ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days",
                 "1", "-extfile", ext]):
        subprocess.run(["openssl", *cmd], check=True, capture_output=True)
    return ca, cert, key


def test_tls_keeps_the_control_channel_confidential(tmp_path, monkeypatch):
    """Issue 21, row 7: with a certificate the control endpoint speaks TLS only: a job's token in the create_job
    answer and every request cross the wire encrypted; a client without TLS, or trusting another CA, gets nowhere."""
    ca, cert, key = _certificate(tmp_path)
    (tmp_path / "other").mkdir()
    other_ca, _, _ = _certificate(tmp_path / "other")
    with SwitchService(SPEC, tls=tls_server_context(cert, key)) as service:
        proxy = _Proxy(service.control_address)
        with SwitchClient(proxy.address, tls_ca=ca) as owner:
            t = owner.create_job(2, window=4)
            monkeypatch.setenv(ENV_TLS_CA, ca)  # join's control connections
            groups = [join(t, r, timing=QUICK) for r in range(2)]
            data = [np.full(SPEC.lanes, 1, np.float32), np.full(SPEC.lanes, 2, np.float32)]
            for got in _allreduce_all(groups, data):
                np.testing.assert_array_equal(got, np.full(SPEC.lanes, 3, np.float32))
            assert owner.counters(t.job.job, t.token)["switch"]["COMPLETED"] > 0
            wire = b"".join(proxy.seen)
            assert len(wire) > 1000 and t.token.encode() not in wire and b"create_job" not in wire
            for g in groups:
                g.port.close()
        with SwitchClient(service.control_address, tls_ca="") as plain, \
                pytest.raises(SwitchUnavailableError, match="hello failed"):
            plain.hello()
        with pytest.raises(SwitchUnavailableError, match=r"no TLS connection to the inagg switch service at "
                                                          r"127.0.0.1:\d+ with CA .*other/ca.pem: .*CERTIFICATE_VERIFY_FAILED"):
            SwitchClient(service.control_address, tls_ca=other_ca)
        deadline = time.monotonic() + 5
        while service.stats["tls_failed"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert service.stats["tls_failed"] == 2

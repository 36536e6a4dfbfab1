"""Hypothesis against the switch service: its control protocol (random JSON shapes and sizes, random op
sequences) and its data plane (mutated and random datagrams).

The service runs in this process; after every example it must still answer, and over the whole run it
must neither meet a bug (``internal_errors``) nor keep what the clients left behind.
"""

import json
import socket
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inagg.host import allreduce
from inagg.host.roce import contribution
from inagg.host.service import Limits, SwitchClient, SwitchService, _mac, join
from inagg.host.vxlan import decap, encap
from inagg.models.job import SwitchSpec

SPEC = SwitchSpec(ports=6, slots=32, chunk_bytes=256)
HANG = 30.0
"""Seconds a socket read or a wait for the service may take before the test calls it a hang: generous, as a
loaded 2-core CI machine answered one line in more than 5 s."""
OPS = ["hello", "create_job", "attach", "counters", "remove_job"]

scalars = st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=20)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=4), max_leaves=30)
# A token drawn as {"$token": i} is the i-th token a create_job answered in this example, when there is one; a
# request whose token is a string is signed with it (and the token left out), as SwitchClient does.
fields = {
    "job": st.integers(-1, 4) | values,
    "token": st.builds(lambda i: {"$token": i}, st.integers(0, 3)) | values,
    "rank": st.integers(-1, 6) | values,
    "endpoint": st.tuples(st.sampled_from(["127.0.0.1", "0.0.0.0", "10.1.2.3", "::1", "x"]),
                          st.integers(-1, 70000)).map(list) | values,
    "workers": st.integers(0, 8) | values,
    "window": st.sampled_from([1, 2, 3, 4, 8, 16, 32]) | values,
}
requests = st.fixed_dictionaries({"op": st.sampled_from(OPS) | values},
                                 optional={**fields, **{k: values for k in ("x", "y")}})
raw_lines = st.binary(max_size=300).map(lambda b: b.replace(b"\n", b""))
# (connection, what): a request, a raw line, a big junk line, or closing the connection and opening it again.
steps = st.tuples(st.integers(0, 2), requests | raw_lines | st.just("close") | st.integers(1_000, 20_000))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def resolve(x, tokens: list[str]):
    if isinstance(x, dict) and set(x) == {"$token"}:
        return tokens[x["$token"] % len(tokens)] if tokens else "no token"
    return x


def test_random_requests_never_stop_the_service():
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0), limits=Limits(requests_per_second=1e6)) as service:
        address = service.control_address

        @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(st.lists(steps, max_size=25))
        def run(script):
            conns: dict[int, socket.socket] = {}
            nonces: dict[int, str] = {}
            seqs: dict[int, int] = {}
            tokens: list[str] = []
            try:
                for i, what in script:
                    if what == "close":
                        if i in conns:
                            conns.pop(i).close()
                        continue
                    if i not in conns:
                        conns[i] = socket.create_connection(address, timeout=HANG)
                        conns[i].sendall(b'{"op": "hello"}\n')
                        nonces[i], seqs[i] = json.loads(conns[i].makefile("rb").readline())["nonce"], 0
                    if isinstance(what, dict):
                        body = {k: resolve(v, tokens) for k, v in what.items()}
                        if isinstance(key := body.pop("token", None), str):  # signed with it, as a client signs
                            seqs[i] += 1
                            body["seq"] = seqs[i]
                            body["mac"] = _mac(key, nonces[i], "request", body)
                        line = json.dumps(body).encode()
                    elif isinstance(what, int):
                        line = b"[" * what + b"]" * what
                    else:
                        line = what
                    conns[i].sendall(line + b"\n")
                    answer = json.loads(conns[i].makefile("rb").readline())
                    assert answer["ok"] is True or answer["ok"] is False and isinstance(answer["error"], str)
                    if answer["ok"] and "ticket" in answer:
                        tokens.append(answer["ticket"]["token"])
            finally:
                for s in conns.values():
                    s.close()
            with SwitchClient(address, timeout=HANG) as c:
                assert c.hello()["ok"]

        run()  # warm-up: the allocator's and hypothesis' own growth
        before = rss_bytes()
        run()
        grown = rss_bytes() - before
        deadline = time.monotonic() + HANG
        with SwitchClient(address) as c:
            while (jobs := c.hello()["jobs"]) and time.monotonic() < deadline:
                time.sleep(0.05)
    assert service.stats["internal_errors"] == 0 and service.stats["bad_requests"] > 0
    assert jobs == 0, "every job goes with the connection that created it"
    assert grown < 64 << 20, f"RSS grew by {grown >> 20} MiB over the second run"


# A valid contribution of the attacker's own job, then cut, bit-flipped, or replaced by random bytes.
mutations = st.one_of(
    st.tuples(st.just("cut"), st.integers(0, 400)),
    st.tuples(st.just("flip"), st.integers(0, 8 * 400)),
    st.tuples(st.just("random"), st.binary(max_size=400)),
)


def test_random_datagrams_never_stop_the_service_nor_touch_another_job():
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0)) as service, SwitchClient(service.control_address) as c, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
        attacker.bind(("127.0.0.1", 0))
        mine = c.create_job(1, window=4)
        c.attach(mine, 0, attacker.getsockname(), receive=lambda t: attacker.settimeout(t) or decap(attacker.recv(99), 1))
        victim = c.create_job(1, window=4)
        sent = []

        @settings(max_examples=300, deadline=None)
        @given(st.integers(0, 1 << 32), mutations, st.booleans())
        def run(chunk, mutation, wrapped):
            frame = bytearray(bytes(contribution(mine.switch, mine.job, 0, chunk, bytes(SPEC.chunk_bytes))))
            kind, x = mutation
            if kind == "cut":
                frame = frame[:x]
            elif kind == "flip" and x < 8 * len(frame):
                frame[x // 8] ^= 1 << (x % 8)
            elif kind == "random":
                frame = bytearray(x)
            attacker.sendto(encap(bytes(frame), 1) if wrapped else bytes(frame), service.vxlan_address)
            sent.append(chunk)

        run()
        g = join(victim, 0)
        try:
            x = np.arange(1000, dtype=np.float32)
            assert np.array_equal(allreduce(x, g), x)
        finally:
            g.port.close()
        deadline = time.monotonic() + HANG
        while service.stats["rx_datagrams"] < len(sent) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert service.stats["internal_errors"] == 0 and service.stats["rx_datagrams"] >= len(sent) >= 300

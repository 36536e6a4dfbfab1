"""The live comparison of RTL and model, on frames from the model itself (no simulator needed)."""

import numpy as np

from inagg.host.controller import plan
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.testbench.bridge.compare import LiveCompare
from inagg.testbench.traffic import contribution, lanes


def traffic(p, chunks, rng):
    """Contributions of every worker, chunk by chunk, one corrupted frame in between (the port drops it)."""
    job = p.jobs[0]
    out = []
    for c in range(chunks):
        for w, ws in enumerate(job.workers):
            out.append((ws.port, contribution(p.switch, job, w, c, lanes(rng, p.switch))))
        if c == 1:
            bad = bytearray(out[-1][1])
            bad[80] ^= 1
            out.append((job.workers[0].port, bytes(bad)))
    return out


def rtl_stand_in(p, frames):
    """What an RTL that behaves like the model sends, and the order its engine took contributions in."""
    sw = ModelSwitch(p.switch)
    for job in p.jobs:
        sw.add_job(job)
    sent, order = [], []
    for port, f in frames:
        before = sw.counters[Counter.RX_CONTRIB] + sw.counters[Counter.DUP_CONTRIB]
        sent += sw.receive(port, f)
        if sw.counters[Counter.RX_CONTRIB] + sw.counters[Counter.DUP_CONTRIB] != before:
            order.append(port)
    return sent, order, dict(sw.counters)


def run(p, frames, sent, order, counters):
    cmp = LiveCompare(p.switch, p.jobs)
    for port, f in frames:
        cmp.sent(port, f)
    half = len(order) // 2
    cmp.taken(order[:half])
    for port, f in sent:  # results may come before the rest of the order is read
        cmp.received(port, f)
    cmp.taken(order[half:])
    return cmp, cmp.finish(counters)


def test_the_same_behaviour_has_no_difference():
    p = plan([3], window=4, chunk_bytes=256)
    frames = traffic(p, 3, np.random.default_rng(1))
    sent, order, counters = rtl_stand_in(p, frames)
    cmp, diffs = run(p, frames, sent, order, counters)
    assert diffs == [] and cmp.count == 0 and cmp.matched == 9


def test_a_changed_frame_a_missing_frame_and_a_counter_are_reported():
    p = plan([2], window=4, chunk_bytes=256)
    frames = traffic(p, 3, np.random.default_rng(2))
    sent, order, counters = rtl_stand_in(p, frames)
    port, f = sent[2]
    sent[2] = (port, f[:-1] + bytes([f[-1] ^ 0xFF]))
    del sent[-1]
    counters[Counter.TX_RESULTS] -= 1
    cmp, diffs = run(p, frames, sent, order, counters)
    what = [d.what for d in diffs]
    assert what == ["the frames differ", "the model sent a frame the RTL does not", "counter TX_RESULTS differs"]
    assert diffs[0].port == port and diffs[0].rtl == sent[2][1].hex() and diffs[0].model == f.hex()
    assert str(diffs[2]) == "counter TX_RESULTS differs\n  rtl   5\n  model 6"


def test_an_order_the_model_cannot_follow_is_reported():
    p = plan([2], window=4, chunk_bytes=256)
    frames = traffic(p, 1, np.random.default_rng(3))
    sent, order, counters = rtl_stand_in(p, frames)
    cmp, diffs = run(p, frames, sent, order + [order[0]], counters)
    assert [d.what for d in diffs] == [f"the RTL took a contribution from port {order[0]} where the model finds none left"]


def test_mode_ii_results_and_reflected_acks_are_matched_each_in_the_models_order():
    from inagg.models.job import SwitchSpec
    from inagg.testbench.replay import is_ack, reached_engine
    from inagg.testbench.traffic import mode_ii_allreduce

    spec = SwitchSpec(ports=2, slots=8, chunk_bytes=256)
    jobs, frames, acks = mode_ii_allreduce(spec, 3)
    sw = ModelSwitch(spec)
    for job in jobs:
        sw.add_job(job)
    out, order = {p: [] for p in range(spec.ports)}, []
    for port, f in frames:
        if reached_engine(sw, port, f, out):  # a chunk mismatch counts as the port's bad VA does
            order.append(port)
    assert acks and sw.counters[Counter.DROP_BAD_ADDRESS] and sw.counters[Counter.ACK_REFLECTED] == acks
    cmp = LiveCompare(spec, tuple(jobs))
    for port, f in frames:
        cmp.sent(port, f)
    cmp.taken(order)
    # The RTL's egress puts the reflected ACKs elsewhere among the results: here all of them after.
    for port, sent in out.items():
        for f in sorted(sent, key=is_ack):
            cmp.received(port, f)
    assert cmp.finish(dict(sw.counters)) == [] and cmp.matched == sum(map(len, out.values()))
    cmp = LiveCompare(spec, tuple(jobs))
    for port, f in frames:
        cmp.sent(port, f)
    cmp.taken(order)
    ack = next(f for f in out[0] if is_ack(f))
    for port, sent in out.items():
        for f in sent + ([ack] if port == 0 else []):
            cmp.received(port, f)
    assert [d.what for d in cmp.finish(dict(sw.counters))] == ["the RTL sent an ACK the model does not"]

"""Mode II (docs/protocol.md section 6.2) through the whole switch in the Amaranth simulator, against the model."""

import dataclasses

import pytest

from inagg.models.job import Mode, SwitchSpec
from inagg.models.rc import Ack, Syndrome
from inagg.models.protocol import Counter
from inagg.testbench.amaranth_switch import cycle, simulate
from inagg.testbench.traffic import make_job, mode_ii_allreduce, rc_ack


@pytest.mark.parametrize("width, seed", [(64, 1), (512, 2)])
def test_mode_ii_allreduce_through_the_switch_is_the_models(width, seed):
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    jobs, traffic, acks = mode_ii_allreduce(spec, seed)
    run = simulate(spec, jobs, traffic, width=width, pause=lambda p: cycle([0, 1, 0, 0, 1]),
                   gaps=lambda p: cycle([0, 0, 1]))
    run.assert_matches()
    for c in (Counter.TX_RESENDS, Counter.DUP_CONTRIB, Counter.DROP_PSN_AHEAD, Counter.ACK_REFLECTED,
              Counter.DROP_BAD_ADDRESS):
        assert run.counters[c] > 0, c.name
    assert run.counters[Counter.ACK_REFLECTED] == acks
    assert run.counters[Counter.COMPLETED] >= 4 + 4, run.counters  # the UC job's four chunks, PSNs 0 to 3


@pytest.mark.parametrize("width", [64, 512])
def test_acks_at_line_rate_never_hold_the_port(width):
    """A burst of ACKs back to back on one port, as fast as it takes beats: every one reflected, the model's
    frame, and the port never holds a beat back (ACK generation keeps up with the ingress, one beat a cycle)."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=256)
    job = dataclasses.replace(make_job(spec, 1, 2, 0, 4), mode=Mode.TRANSLATED)
    traffic = [(0, rc_ack(spec, job, 0, Ack(n, Syndrome.NAK_SEQ if n % 5 == 4 else Syndrome.ACK, n)))
               for n in range(120)]
    run = simulate(spec, [job], traffic, width=width, cycles=100)
    run.assert_matches()
    assert run.counters[Counter.ACK_REFLECTED] == len(traffic) and run.stalls == {0: 0, 1: 0}

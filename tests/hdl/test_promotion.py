"""FP32 promotion in the whole switch (Amaranth simulator), result frames byte for byte against the model."""

import numpy as np
import pytest

from inagg.models.job import SwitchSpec
from inagg.models.protocol import Counter, decode_imm
from inagg.testbench.amaranth_switch import cycle, simulate
from inagg.testbench.promotion import adversarial
from inagg.testbench.traffic import contribution, make_job

CHUNK = 256
IMM = slice(70, 74)  # ImmDt in a result frame


def _fp32_results(frames):
    return sum(decode_imm(int.from_bytes(f[IMM], "big"))[1] for fs in frames.values() for f in fs)


@pytest.mark.parametrize("width", [64, 512])
def test_promoted_and_integer_chunks(width):
    """A chunk of every pattern, an INT32 chunk, a chunk with one promoted lane; a loss, a duplicate, a resend."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=CHUNK)
    n = 5
    job = make_job(spec, 1, n, 0, 8)
    rng = np.random.default_rng(width)
    one = adversarial(rng, n, spec.lanes, ("small",))
    one[:, 17] = adversarial(rng, n, 1, ("last",))[:, 0]
    chunks = [adversarial(rng, n, spec.lanes), adversarial(rng, n, spec.lanes, ("small",)), one]
    frames = {(w, c): (job.workers[w].port, contribution(spec, job, w, c, chunks[c][w]))
              for c in range(3) for w in range(n)}
    traffic = [frames[w, c] for c in range(3) for w in range(n) if (w, c) != (2, 0)]
    traffic.insert(3, frames[1, 0])             # a duplicate while chunk 0 aggregates
    traffic += [frames[2, 0], frames[4, 0]]     # the lost one, then a resend of a promoted result
    run = simulate(spec, [job], traffic, width=width, pause=lambda p: cycle([0, 0, 1]))
    run.assert_matches()
    assert run.counters[Counter.COMPLETED] == 3 and run.counters[Counter.PROMOTED] == 2
    assert run.counters[Counter.TX_RESENDS] == 1
    assert _fp32_results(run.received) == 2 * n + 1


def test_back_to_back_on_one_slot_at_four_beats():
    """Frames of 4 beats to one slot with no idle cycle, every addition in FP32: no stale read."""
    spec = SwitchSpec(ports=2, slots=16, chunk_bytes=CHUNK)
    n = 8
    job = make_job(spec, 0, n, 0, 2)
    rng = np.random.default_rng(5)
    values = [adversarial(rng, n, spec.lanes, ("alternating", "random", "ties")) for _ in range(2)]
    t = [(w % 2, contribution(spec, job, w, c, values[c][w])) for c in range(2) for w in range(n)]
    run = simulate(spec, [job], t, width=512)
    run.assert_matches()
    assert run.counters[Counter.PROMOTED] == 2

"""The testbenches' replay of the RTL's engine order into the model switch."""

import numpy as np
import pytest

from inagg.models.job import SwitchSpec
from inagg.models.switch import ModelSwitch
from inagg.testbench.replay import replay
from inagg.testbench.traffic import contribution, lanes, make_job

SPEC = SwitchSpec(ports=2, slots=8, chunk_bytes=256)
JOB = make_job(SPEC, 0, 2, 0, 4)


def _model():
    m = ModelSwitch(SPEC)
    m.add_job(JOB)
    return m


def _sent():
    rng = np.random.default_rng(0)
    junk = b"\xff" * 60
    return {0: [junk, contribution(SPEC, JOB, 0, 0, lanes(rng, SPEC))],
            1: [contribution(SPEC, JOB, 1, 0, lanes(rng, SPEC)), junk]}


def test_merges_ports_in_engine_order():
    out = replay(_model(), _sent(), [1, 0])
    assert [len(out[p]) for p in (0, 1)] == [1, 1]


def test_refuses_an_order_the_frames_cannot_give():
    with pytest.raises(AssertionError, match=r"contribution #2 came from port 0, where the model finds none left"):
        replay(_model(), _sent(), [1, 0, 0])
    with pytest.raises(AssertionError, match=r"the model takes a frame of port 0 that the RTL's engine never took"):
        replay(_model(), _sent(), [1])

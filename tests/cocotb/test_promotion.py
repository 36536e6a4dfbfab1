"""FP32 promotion in the switch top on Verilator under cocotb, against the model (see cocotb_promotion.py).

W = 64 with 64 workers per job (``MAX_WORKERS``, the most the switch
takes) and W = 512 with chunks of 4 beats, one Verilated build each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.cocotb

BUILDS = {
    "w64": dict(ports=2, width=64, slots=8, chunk_bytes=256, jobs=2, workers=64),
    "w512": dict(ports=2, width=512, slots=8, chunk_bytes=256, jobs=2, workers=8),
}
STIMULUS = {"w64": dict(chunks=4), "w512": dict(chunks=8)}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_promotion(name):
    from inagg.testbench.sim import build_switch, run

    params = BUILDS[name]
    runner, build_dir = build_switch(**params)
    run(runner, build_dir, "cocotb_promotion", Path(__file__).parent,
        INAGG_PARAMS=json.dumps({**params, **STIMULUS[name]}))

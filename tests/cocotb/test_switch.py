"""The switch top on Verilator under cocotb, compared with the model switch (see cocotb_switch.py).

One Verilated build per width, reused by every test of the module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.cocotb

BUILDS = {
    "w64": dict(ports=3, width=64, slots=16, chunk_bytes=256, jobs=3, workers=32),
    "w512": dict(ports=2, width=512, slots=16, chunk_bytes=256, jobs=2, workers=8),
}
STIMULUS = {"w64": dict(chunks=8), "w512": dict(chunks=12)}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_switch(name):
    from inagg.testbench.sim import build_switch, run

    params = BUILDS[name]
    runner, build_dir = build_switch(**params)
    run(runner, build_dir, "cocotb_switch", Path(__file__).parent,
        INAGG_PARAMS=json.dumps({**params, **STIMULUS[name]}))

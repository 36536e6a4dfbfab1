"""The switch with its exception path on Verilator: collisions at chosen rates against the model switch.

One Verilated build per width, reused by every test of the module
(``cocotb_collisions.py``) and by ``test_teardown.py`` in this folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.cocotb

BUILDS = {
    "w64": dict(ports=2, width=64, slots=32, chunk_bytes=256, jobs=8, workers=4, exc_table=16, exc_max_kicks=8,
                exc_stash=2),
    "w512": dict(ports=2, width=512, slots=64, chunk_bytes=256, jobs=8, workers=2, exc_table=32, exc_max_kicks=16,
                 exc_stash=4),
}
STIMULUS = {"w64": dict(contributions=240), "w512": dict(contributions=480)}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_collisions(name):
    from inagg.testbench.sim import build_switch

    build_switch(**BUILDS[name]).run("cocotb_collisions", module_dir=Path(__file__).parent, stimulus=STIMULUS[name])

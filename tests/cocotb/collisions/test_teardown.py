"""Job teardown on Verilator against the model switch, on the builds of test_collisions.py (no build of its own).

``cocotb_teardown.py``: the exception table and stash fill and a contribution is refused, a job is torn down
with partial sums in its slots, the refused contributions retransmitted go into its freed overflow slots, a new
job takes its fast slots; teardowns of a job that does not exist and of one whose slots host other keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_collisions import BUILDS

pytestmark = [pytest.mark.cocotb, pytest.mark.reuses_build]


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_teardown(name):
    from inagg.testbench.sim import build_switch

    build_switch(**BUILDS[name]).run("cocotb_teardown", module_dir=Path(__file__).parent)

"""The switch top on Verilator under cocotb, compared with the model switch: the runner of this folder.

The folder holds the switch top's cocotb tests; its testbench class,
:class:`~inagg.testbench.switch_tb.SwitchTB`, is library code in
``testbench/`` because the benchmarks drive it too. One Verilated build per
width, shared by the switch's tests (cocotb_switch.py)
and those of FP32 promotion (cocotb_promotion.py): its parameters are the
union of what both need. W = 64 takes 64 workers per job (``MAX_WORKERS``,
the most the switch takes), for promotion's job of every worker; W = 512
runs chunks of 4 beats. ``most_workers`` is the size of the largest job the
switch's random stimulus makes. Mode II's test (cocotb_translated.py), Mode III's
(cocotb_augmented.py) and the management bridge's (cocotb_mgmt.py) run on
both builds too: each takes Mode III jobs (``augmented``) and has a
management port (0 at W = 64, 1 at W = 512) and a key, which every other
test leaves untouched (the bridge takes only management frames, and the
testbench's AXI4-Lite manager comes first at the arbiter; no other test
installs a Mode III job), so neither costs builds of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.cocotb

MGMT_KEY = bytes(range(0x10, 0x20)).hex()
BUILDS = {
    "w64": dict(ports=3, width=64, slots=16, chunk_bytes=256, jobs=3, workers=64, mgmt_port=0, mgmt_key=MGMT_KEY,
                augmented=True),
    "w512": dict(ports=2, width=512, slots=16, chunk_bytes=256, jobs=2, workers=8, mgmt_port=1, mgmt_key=MGMT_KEY,
                 augmented=True),
}
STIMULUS = {
    "cocotb_switch": {"w64": dict(chunks=8, most_workers=32), "w512": dict(chunks=12, most_workers=8)},
    "cocotb_promotion": {"w64": dict(chunks=4), "w512": dict(chunks=8)},
}


@pytest.mark.parametrize("module", sorted(STIMULUS))
@pytest.mark.parametrize("name", sorted(BUILDS))
def test_switch(name, module):
    from inagg.testbench.sim import build_switch

    build_switch(**BUILDS[name]).run(module, module_dir=Path(__file__).parent, stimulus=STIMULUS[module][name])


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_mode_ii(name):
    from inagg.testbench.sim import build_switch

    build_switch(**BUILDS[name]).run("cocotb_translated", module_dir=Path(__file__).parent)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_mode_iii(name):
    from inagg.testbench.sim import build_switch

    build_switch(**BUILDS[name]).run("cocotb_augmented", module_dir=Path(__file__).parent)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_mgmt(name):
    from inagg.testbench.sim import build_switch

    build_switch(**BUILDS[name]).run("cocotb_mgmt", module_dir=Path(__file__).parent)

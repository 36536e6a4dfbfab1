"""The Ethernet MAC under cocotb on Verilator: on GMII at two beat widths, on RGMII at one (testbench: cocotb_mac.py).

cocotbext-eth's ``GmiiSource``/``GmiiSink`` (``RgmiiSource``/``RgmiiSink``)
stand for the PHY and cocotbext-axi's stream models for the switch; the
receive, transmit and switch clocks are unrelated (125 MHz, 125 MHz less
0.1 %, and the switch's). The RGMII top models the DDR pins in logic
(:mod:`inagg.testbench.mac` says why).
"""

from pathlib import Path

import pytest

from inagg.testbench.mac import build_mac

pytestmark = pytest.mark.cocotb


@pytest.mark.parametrize("width, phy", [(64, "gmii"), (256, "gmii"), (64, "rgmii")])
def test_mac(width, phy):
    build_mac(width, phy).run("cocotb_mac", module_dir=Path(__file__).parent, stimulus=dict(seed=width))

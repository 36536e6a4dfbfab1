"""The whole board top under cocotb on Verilator, RGMII in and out (testbench: cocotb_board.py).

One build: the Colorlight's default board top (:data:`inagg.hdl.board.BOARDS`)
with its switch behind two RGMII MACs, the DDR pins modelled in flip-flops
(:mod:`inagg.testbench.board` says why); every case of cocotb_board.py runs on it.
"""

from pathlib import Path

import pytest

pytestmark = pytest.mark.cocotb

BUILD = dict(board="colorlight-5a75b", mgmt_key=bytes(range(0x20, 0x30)).hex(), mgmt_port=0)


def test_board_top():
    from inagg.testbench.board import build_board

    build_board(**BUILD).run("cocotb_board", module_dir=Path(__file__).parent, stimulus=dict(chunks=32))

"""The board tops elaborated for their amaranth-boards platforms: pins, clocks, PLL, parameters; and `inagg board`."""

import gc
import re
import warnings
from fractions import Fraction

import pytest
from amaranth.build import Subsignal

from inagg import cli
from inagg.hdl.board import BOARDS, TX_HZ, BoardTop, board, pll_dividers

KEY = bytes(range(16))


@pytest.mark.parametrize("f_in,f_os", [(25_000_000, 50_000_000), (100_000_000, 50_000_000),
                                       (25_000_000, 62_500_000), (100_000_000, 75_000_000)])
def test_pll_dividers_make_the_frequencies_exactly(f_in, f_os):
    d = pll_dividers(f_in, TX_HZ, f_os)
    assert Fraction(f_in, d["CLKI_DIV"]) * d["CLKFB_DIV"] == TX_HZ
    vco = TX_HZ * d["CLKOP_DIV"]
    assert 400e6 <= vco <= 800e6 and vco == f_os * d["CLKOS_DIV"]


def test_pll_dividers_refuse_an_inexact_clock():
    with pytest.raises(ValueError, match=r"^No ECP5 PLL setting makes 125 MHz and 33 MHz from 25 MHz exactly$"):
        pll_dividers(25_000_000, TX_HZ, 33_000_000)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(name="de0-nano"), ValueError, r"^Board must be one of colorlight-5a75b, versa-ecp5, not 'de0-nano'$"),
    (dict(ports=4), TypeError, "ports is not a parameter"),
    (dict(sync_hz=10_000_000), ValueError, "Switch clock must be an integer from 20 to 200 MHz"),
    (dict(mgmt_port=2), ValueError, r"Management port must be an integer in 0\.\.1, not 2"),
    (dict(mgmt_key=b"short"), ValueError, "Management key must be 16 bytes"),
])
def test_board_top_checks_its_arguments(kw, exc, msg):
    kw = {"name": "colorlight-5a75b", "mgmt_key": KEY, **kw}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the parts made before the refusal are, rightly, never elaborated
        with pytest.raises(exc, match=msg):
            BoardTop(**kw)
        gc.collect()


def _prepare(name, **kw):
    platform = board(name).make_platform()
    top = BoardTop(name, mgmt_key=KEY, **kw)
    plan = platform.prepare(top, name="top")
    return platform, top, plan.files["top.il"], plan.files["top.lpf"]


@pytest.fixture(scope="module", params=list(BOARDS))
def default_build(request):
    return (request.param, *_prepare(request.param))


def _sites(lpf: str) -> dict[str, str]:
    return dict(re.findall(r'LOCATE COMP "([^"]+)" SITE "([^"]+)";', lpf))


@pytest.mark.slow
def test_every_rgmii_pin_of_the_board_is_assigned(default_build):
    name, platform, top, il, lpf = default_build
    sites = set(_sites(lpf).values())
    for port in range(2):
        for sub in platform.lookup("eth_rgmii", port).ios:
            if isinstance(sub, Subsignal) and sub.name not in ("mdc", "mdio"):  # no MDIO: the PHYs' defaults
                assert set(sub.ios[0].names) <= sites, (name, port, sub.name)
    assert len(sites) == len(_sites(lpf))  # a pin the two PHYs share (Colorlight: reset) once
    clock = platform.lookup(platform.default_clk).ios[0]
    assert set(getattr(clock, "p", clock).names) <= sites  # of a differential clock, its P pin


@pytest.mark.slow
def test_clocks_plls_and_ddr_primitives(default_build):
    name, platform, top, il, lpf = default_build
    assert il.count("cell \\EHXPLLL") == 1
    # Per port: RXD and RX_CTL into IDDRX1F; TXD, TX_CTL and TXC out of ODDRX1F.
    assert il.count("cell \\IDDRX1F") == 10 and il.count("cell \\ODDRX1F") == 12
    freqs = sorted(float(f) for f in re.findall(r"FREQUENCY (?:NET|PORT) \"[^\"]+\" ([\d.]+) HZ;", lpf))
    assert freqs == sorted([50e6, 125e6, 125e6, 125e6, platform.default_clk_frequency])
    d = top.pll.dividers
    assert Fraction(int(platform.default_clk_frequency), d["CLKI_DIV"]) * d["CLKFB_DIV"] == TX_HZ
    assert TX_HZ * d["CLKOP_DIV"] == 50e6 * d["CLKOS_DIV"]


@pytest.mark.slow
def test_leds_and_the_boards_switch(default_build):
    name, platform, top, il, lpf = default_build
    leds = [n for n in _sites(lpf) if n.startswith("led_")]
    # Heartbeat, then each port's receive and send: five, or as many as the board has.
    assert len(leds) == {"colorlight-5a75b": 1, "versa-ecp5": 5}[name]
    g = top.switch.geometry
    assert (g.ports, g.width) == (2, 64) and top.switch.mgmt_port == 0
    assert {k: getattr(g, k) for k in BOARDS[name].switch} == BOARDS[name].switch


@pytest.mark.slow
def test_parameters_reach_the_switch_and_the_pll():
    platform, top, il, lpf = _prepare("colorlight-5a75b", mgmt_port=1, sync_hz=62_500_000, slots=32, jobs=2,
                                      workers=2)
    g = top.switch.geometry
    assert (g.slots, g.jobs, g.workers) == (32, 2, 2) and top.switch.mgmt_port == 1
    assert "FREQUENCY NET \"pll.clk_os\" 62500000.0 HZ;" in lpf
    assert re.search(r"parameter \\CLKOS_DIV {}\n".format(top.pll.dividers["CLKOS_DIV"]), il)
    assert TX_HZ * top.pll.dividers["CLKOP_DIV"] == 62_500_000 * top.pll.dividers["CLKOS_DIV"]


def test_cli_refuses_an_unknown_board(capsys):
    assert cli.main(["board", "build", "--board", "arty-a7"]) == 2
    assert "Board must be one of colorlight-5a75b, versa-ecp5, not 'arty-a7'" in capsys.readouterr().err
    assert cli.main(["board", "program", "--board", "arty-a7"]) == 2


def test_cli_refuses_a_key_file_of_the_wrong_length(tmp_path, capsys):
    key = tmp_path / "board.key"
    key.write_text("00112233445566778899aabbccddee\n")  # 15 bytes
    assert cli.main(["board", "build", "--board", "versa-ecp5", "--mgmt-key-file", str(key),
                     "--out", str(tmp_path / "b")]) == 2
    assert "must hold the board's key as 32 hex digits" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_cli_program_prints_commands_and_runs_none(tmp_path, capsys):
    assert cli.main(["board", "program", "--board", "colorlight-5a75b", "--out", str(tmp_path)]) == 2
    assert f"no bitstream {tmp_path / 'top.bit'}" in capsys.readouterr().err
    (tmp_path / "top.bit").write_bytes(b"")
    assert cli.main(["board", "program", "--board", "colorlight-5a75b", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"openFPGALoader --cable ft232 {tmp_path / 'top.bit'}" in out and "ecpprog" not in out
    assert cli.main(["board", "program", "--board", "versa-ecp5", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"ecpprog -S {tmp_path / 'top.bit'}" in out and "--cable ft2232" in out


def test_board_report_gives_every_clock():
    from inagg.hdl.synth.cli import format_result
    from inagg.hdl.synth.ecp5 import SynthResult

    clocks = {"pll.clk_os": {"fmax_mhz": 61.2, "constraint_mhz": 50.0},
              "pll.clk_op": {"fmax_mhz": 118.0, "constraint_mhz": 125.0}}
    r = SynthResult(device="LFE5U-25F", width=64, luts=22000, ffs=11000, ebr=34, dsp=0, luts_avail=24288,
                    ffs_avail=24288, ebr_avail=56, dsp_avail=28, fmax_mhz=118.0, constraint_mhz=125.0,
                    timing_met=False, clocks=clocks, board="colorlight-5a75b")
    text = format_result(r)
    assert text.startswith("board colorlight-5a75b   device LFE5U-25F")
    assert "pll.clk_os                          61.2        50.0  met" in text
    assert "pll.clk_op                         118.0       125.0  MISSED" in text
    assert "W x Fmax" not in text

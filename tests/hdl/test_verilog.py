"""`inagg verilog`: the file it writes, its errors, and Verilator's -Wall lint on it with hdl/lint.vlt.

Every Verilator build lints its design the same way (``inagg.testbench.sim.LINT``).
"""

import subprocess

import pytest

from inagg.cli import main

# The plain top of these tests: written once (a W = 64 switch takes seconds to convert) and read by
# the name, exception-path and lint tests.
PLAIN = ["--ports", "2", "--width", "64", "--slots", "8", "--chunk-bytes", "256", "--jobs", "2", "--workers", "4"]


@pytest.fixture(scope="module")
def plain_top(tmp_path_factory):
    """The file ``inagg verilog --name sw`` writes for :data:`PLAIN`."""
    out = tmp_path_factory.mktemp("verilog") / "switch.v"
    assert main(["verilog", *PLAIN, "--name", "sw", "-o", str(out)]) == 0
    return out


def test_writes_the_top(plain_top):
    text = plain_top.read_text()
    assert "module sw(" in text and "s1_axis_tdata" in text and "s_axil_araddr" in text


def test_refuses_bad_parameters(capsys):
    assert main(["verilog", "--slots", "100", "-o", "-"]) == 2
    assert capsys.readouterr().err == ("inagg verilog: error: Slot count must be a power of two from 2 to 65536, "
                                       "not 100\n")


def test_writes_the_top_with_an_exception_path(tmp_path, plain_top):
    out = tmp_path / "switch.v"
    assert main(["verilog", *PLAIN, "--exc-table", "4", "--exc-max-kicks", "2", "--exc-stash", "1",
                 "--divert-frames", "2", "-o", str(out)]) == 0
    # The cuckoo walker's kick counter exists only with an exception path.
    assert "kicks" in out.read_text() and "kicks" not in plain_top.read_text()


def test_refuses_a_bad_exception_table(capsys):
    assert main(["verilog", "--exc-table", "3", "-o", "-"]) == 2
    assert capsys.readouterr().err == ("inagg verilog: error: Exception table must be 0 (no exception path) or a "
                                       "power of two from 2 to 65536, not 3\n")


def test_writes_the_top_with_a_management_bridge(tmp_path, plain_top):
    out = tmp_path / "switch.v"
    assert main(["verilog", *PLAIN, "--mgmt-port", "1", "--mgmt-key", "00" * 16, "-o", str(out)]) == 0
    # The bridge's SipHash rounds exist only with a management port.
    assert "mgmt.hash" in out.read_text() and "mgmt.hash" not in plain_top.read_text()


def test_refuses_a_key_that_is_not_32_hex_digits(capsys):
    with pytest.raises(SystemExit) as e:  # argparse's exit
        main(["verilog", *PLAIN, "--mgmt-port", "1", "--mgmt-key", "00" * 15, "-o", "-"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("inagg verilog: error: argument --mgmt-key: a management key is 32 hex "
                                            f"digits, not '{'00' * 15}'\n")


def test_refuses_a_management_port_without_a_key(capsys):
    assert main(["verilog", *PLAIN, "--mgmt-port", "1", "-o", "-"]) == 2
    assert capsys.readouterr().err == "inagg verilog: error: Management key must be 16 bytes, not None\n"


@pytest.mark.parametrize("width, extra", [(64, ()), (512, ()), (64, ("--mode-iii",))])
def test_lint_is_clean(tmp_path, request, width, extra):
    from inagg.testbench import toolchain
    from inagg.testbench.sim import LINT

    root = toolchain.activate()
    if width == 64 and not extra:
        out = request.getfixturevalue("plain_top")
    else:
        out = tmp_path / "switch.v"
        assert main(["verilog", *PLAIN, "--width", str(width), *extra, "-o", str(out)]) == 0
    lint = subprocess.run([str(root / "bin" / "verilator"), "--lint-only", *LINT, str(out)],
                          capture_output=True, text=True)
    assert lint.returncode == 0 and "%Warning" not in lint.stderr and "%Error" not in lint.stderr, lint.stderr[:3000]

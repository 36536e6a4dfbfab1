"""The one Verilator build helper: a design and a parameter set in, a cached Verilated model out.

:func:`build` turns a design (a callable that takes the parameter set and
returns a :class:`~amaranth.lib.wiring.Component` or Verilog text) into a
Verilated model in ``sim_build/<design>_<parameters>[_<waves>]`` at the top
of the repository (or under the folder ``INAGG_SIM_BUILD`` names). The Verilog (generated once per process) is rewritten
only when it changes, so cocotb's runner reuses the model across test runs
and processes; a lock file in the folder keeps processes (pytest-xdist
workers) that want the same build from compiling it at once. Every build
lints its design as ``tests/hdl/test_verilog.py`` does (:data:`LINT`:
``-Wall`` with the project's one waiver file, ``hdl/lint.vlt``), and any
warning not waived there stops it. :class:`Public`
names what a testbench reaches through VPI, so Verilator optimises the
rest; without it every signal is public (fine for a small unit).

:meth:`Build.run` runs a cocotb test module on the model. The module reads
the build's parameter set with :func:`parameters` and the runner's stimulus
settings with :func:`stimulus`, the same way for every design.
``WAVES=1`` in the environment (cocotb's own switch) builds with VCD
tracing in a folder of its own and writes ``dump.vcd`` there; a build can
also ask for a format (``fst`` or ``vcd``) and a run for a file name.
Whatever Verilator, the compiler and the simulator print goes to standard
error: standard output is the caller's (``inagg demo --json``).

:func:`build_switch` is the switch top's build on it; the bridge harness's
is :mod:`inagg.testbench.bridge.build`. Where a design's testbench goes:
``docs/architecture.md``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from inagg import hdl
from inagg.testbench import toolchain

__all__ = ["ROOT", "BUILD_ROOT_ENV", "LINT_WAIVERS", "LINT", "WAVE_FORMATS", "PARAMS_ENV", "STIMULUS_ENV", "Public", "Build",
           "waves_enabled", "wave_format", "check_fst", "build_dir", "build", "parameters", "stimulus",
           "SWITCH_TOPLEVEL", "build_switch"]

ROOT = Path(__file__).resolve().parents[1]
#: The environment variable naming the folder of the builds instead of ``sim_build/`` (a test's cold build).
BUILD_ROOT_ENV = "INAGG_SIM_BUILD"
LINT_WAIVERS = Path(hdl.__file__).resolve().parent / "lint.vlt"
#: Verilator's lint options of every build and of the lint test: all warnings, the project's waivers.
LINT = ("-Wall", str(LINT_WAIVERS))
WAVE_FORMATS = ("fst", "vcd")
PARAMS_ENV, STIMULUS_ENV = "INAGG_PARAMS", "INAGG_STIMULUS"


def waves_enabled() -> bool:
    """True when ``WAVES=1`` asks for waveforms."""
    return os.environ.get("WAVES", "0") not in ("", "0")


def wave_format(path: str | os.PathLike) -> str:
    """The waveform format a file name asks for: ``fst`` or ``vcd``; ValueError for any other suffix."""
    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in WAVE_FORMATS:
        raise ValueError(f"a waveform file ends in .fst or .vcd, not {Path(path).name!r}")
    return fmt


def check_fst() -> None:
    """Raise :class:`~inagg.testbench.toolchain.MissingTool` when the lz4 headers are missing.

    Verilator's FST writer compiles against them, and no wheel ships them.
    """
    probe = subprocess.run(["g++", "-E", "-x", "c++", "-"], input="#include <lz4.h>\n", capture_output=True, text=True)
    if probe.returncode:
        raise toolchain.MissingTool("FST waveforms need the lz4 headers (Debian/Ubuntu: apt-get install liblz4-dev); "
                                    "VCD needs nothing more: name the file .vcd")


_PORT = re.compile(r"^\s*(input|output)\s+(?:\[[^\]]*\]\s*)?(\w+);", re.M)


@dataclass(frozen=True)
class Public:
    """What a testbench reaches through VPI, and nothing more.

    cocotb's runner would make every signal public (``--public-flat-rw``),
    which keeps Verilator from optimising the logic between them and sends
    every writable signal's readers through each evaluation, as an input's.
    With a ``Public`` the build makes the top's inputs writable and its
    outputs readable, plus these.

    Parameters
    ----------
    writable, readable : tuple of str
        Signals of the top module the testbench writes, or only reads.
    instances : tuple of str
        Instance paths below the top (``core.divert.engine``) whose every
        signal the testbench reads.
    """

    writable: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()

    def control_file(self, verilog: str, toplevel: str) -> str:
        """The Verilator control file for the module ``toplevel`` of ``verilog``."""
        top = verilog[verilog.index(f"module {toplevel}("):]
        top = top[:top.index("endmodule")]
        rules = [("public_flat_rw" if d == "input" else "public_flat_rd", toplevel, name)
                 for d, name in _PORT.findall(top)]
        rules += [("public_flat_rw", toplevel, name) for name in self.writable]
        rules += [("public_flat_rd", toplevel, name) for name in self.readable]
        rules += [("public_flat_rd", f"{toplevel}.{path}", "*") for path in self.instances]
        return "`verilator_config\n" + "".join(f'{rule} -module "{module}" -var "{var}"\n'
                                                for rule, module, var in rules)


def parameters() -> dict:
    """The parameter set of the build a cocotb test module runs on (call it inside the simulator)."""
    return json.loads(os.environ[PARAMS_ENV])


def stimulus() -> dict:
    """The stimulus settings the runner gave :meth:`Build.run` (call it inside the simulator)."""
    return json.loads(os.environ.get(STIMULUS_ENV, "{}"))


@dataclass(frozen=True)
class Build:
    """A Verilated design in its build folder, ready to run cocotb test modules on.

    Parameters
    ----------
    runner : cocotb_tools.runner.Verilator
        The runner that built it.
    folder : Path
        The build folder; runs happen there, so results and waveforms land there.
    toplevel : str
        The Verilog top module's name.
    params : Mapping
        The parameter set it was built with, handed to every run.
    waves : str or None
        The waveform format it traces in, or None.
    """

    runner: object
    folder: Path
    toplevel: str
    params: Mapping[str, object] = field(default_factory=dict)
    waves: str | None = None

    def run(self, test_module: str, *, module_dir: Path | None = None, stimulus: Mapping[str, object] | None = None,
            waves_file: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> None:
        """Run the cocotb tests of ``test_module``; raise AssertionError if any failed.

        ``module_dir`` is the folder of a module that is not importable from
        here (a test folder); ``stimulus`` goes to the module as
        :func:`stimulus`; ``waves_file`` names the waveform file of the run
        (the build must trace in its format); ``env`` adds environment variables.
        """
        from cocotb_tools.check_results import get_results

        results = self.folder / f"results_{test_module.rsplit('.', 1)[-1]}_{os.getpid()}.xml"
        args = ["--trace-file", str(Path(waves_file).resolve())] if waves_file is not None else []
        env = {**(env or {}), PARAMS_ENV: json.dumps(dict(self.params)), STIMULUS_ENV: json.dumps(dict(stimulus or {}))}
        # The runner hands this process's sys.path to the simulator as PYTHONPATH.
        if module_dir is not None:
            sys.path.insert(0, str(module_dir))
        try:
            self.runner.test(test_module=test_module, hdl_toplevel=self.toplevel, hdl_toplevel_lang="verilog",
                             build_dir=self.folder, test_dir=self.folder, results_xml=str(results),
                             waves=self.waves is not None or waves_file is not None, test_args=args, extra_env=env)
        finally:
            if module_dir is not None:
                sys.path.remove(str(module_dir))
        tests, failed = get_results(results)
        if tests == 0 or failed:
            raise AssertionError(f"{failed} of {tests} cocotb tests of {test_module} failed (see {results})")
        results.unlink()


def build_dir(design: str, params: Mapping[str, object], waves: str | None = None) -> Path:
    """Where the build of ``design`` with ``params`` lives (``waves``: the waveform format it writes, or None)."""
    name = "_".join([design, *(f"{k}{v}" for k, v in sorted(params.items())), *([waves] if waves else [])])
    return Path(os.environ.get(BUILD_ROOT_ENV) or ROOT / "sim_build") / name


_VERILOG: dict[tuple, str] = {}


def _verilog(design: str, toplevel: str, params: Mapping[str, object], source: Callable) -> str:
    """The Verilog of ``source(**params)``, generated once per process (a big design takes seconds)."""
    key = (design, toplevel, tuple(sorted(params.items())))
    if key not in _VERILOG:
        from amaranth.back import verilog

        made = source(**params)
        _VERILOG[key] = made if isinstance(made, str) else verilog.convert(made, name=toplevel, emit_src=False)
    return _VERILOG[key]


def build(design: str, params: Mapping[str, object], source: Callable[..., object], *, toplevel: str,
          public: Public | None = None, optimize: Sequence[str] = (), optimize_traced: Sequence[str] | None = None,
          waves: str | None = None) -> Build:
    """Verilate ``source(**params)`` as module ``toplevel`` into the folder of ``design`` and ``params``.

    Parameters
    ----------
    design : str
        The folder's prefix under ``sim_build/``, one per design.
    params : Mapping
        The parameter set: JSON values, named in the folder and handed to every run.
    source : callable
        Called with ``**params``; returns a :class:`~amaranth.lib.wiring.Component` or its Verilog text.
    toplevel : str
        The Verilog top module's name.
    public : Public or None
        What the testbench reaches (None: every signal).
    optimize : sequence of str
        Verilator's optimisation options for this design (``-O3``, ``-CFLAGS -O3``, ...).
    optimize_traced : sequence of str or None
        Those of a build with tracing, whose compile may matter more than its speed (None: ``optimize``).
    waves : str or None
        Trace in this format (``fst`` or ``vcd``); None: VCD when ``WAVES=1``, else no tracing.
    """
    from cocotb_tools import runner as cocotb_runner

    toolchain.activate()
    if waves is None and waves_enabled():
        waves = "vcd"
    if waves is not None and waves not in WAVE_FORMATS:
        raise ValueError(f"a waveform format is one of {WAVE_FORMATS}, not {waves!r}")
    if waves == "fst":
        check_fst()
    folder = build_dir(design, params, waves)
    folder.mkdir(parents=True, exist_ok=True)
    text = _verilog(design, toplevel, params, source)
    files = {f"{toplevel}.v": text}
    if public is not None:
        files[f"{toplevel}.vlt"] = public.control_file(text, toplevel)
    # The machines this runs on are shared: one compiler process at a time.
    cocotb_runner.MAX_PARALLEL_BUILD_JOBS = 1
    runner = _runner_class()()
    if waves is not None and optimize_traced is not None:
        optimize = optimize_traced
    args = [*LINT, *(["--no-public-flat-rw"] if public is not None else []), *optimize,
            *(["--trace-fst"] if waves == "fst" else [])]
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, content in files.items():
            if not (folder / name).exists() or (folder / name).read_text() != content:
                (folder / name).write_text(content)
        runner.build(sources=[folder / name for name in files], hdl_toplevel=toplevel, build_dir=folder,
                     always=False, build_args=args, waves=waves is not None)
    return Build(runner, folder, toplevel, dict(params), waves)


# Where the runner's commands write: file descriptor 2, not sys.stderr, which a caller may have replaced
# by an object without one.
STDERR_FD = 2


@cache
def _runner_class() -> type:
    """cocotb's Verilator runner with every command's output on standard error.

    cocotb's own lets Verilator's, the compiler's and the simulator's output
    through to standard output, where a caller's document goes (``inagg demo
    --json`` piped into a JSON reader).
    """
    from cocotb_tools import runner as cocotb_runner

    class Verilator(cocotb_runner.Verilator):
        def _execute(self, cmds, cwd) -> None:
            if self.log_file is None:
                self._execute_cmds(cmds, cwd, STDERR_FD)
            else:
                super()._execute(cmds, cwd)

    return Verilator


SWITCH_TOPLEVEL = "inagg_switch"
# The exception engine's instances, whose state testbench.collisions.engine_state reads.
_ENGINE = ("core.divert.engine", "core.divert.engine.core")


def _switch_verilog(*, mgmt_key: str | None = None, **params) -> str:
    from inagg.hdl.switch import generate_verilog
    from inagg.models.mgmt import parse_key

    return generate_verilog(SWITCH_TOPLEVEL, mgmt_key=None if mgmt_key is None else parse_key(mgmt_key), **params)


def build_switch(**params) -> Build:
    """Verilate the switch top with ``params`` (those of :func:`~inagg.hdl.switch.generate_verilog`, but
    ``mgmt_key`` in hex: a build's parameters are JSON values).

    The testbench reaches the top's ports and, in a build with an exception path, the signals of
    the exception engine; nothing else is visible through VPI.
    """
    return build("switch", params, _switch_verilog, toplevel=SWITCH_TOPLEVEL,
                 public=Public(instances=_ENGINE if params.get("exc_table") else ()), optimize=["-O2"])

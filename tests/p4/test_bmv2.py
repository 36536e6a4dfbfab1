"""The reference vectors through BMv2 simple_switch, where it and p4c-bm2-ss are installed (p4/tests/run_bmv2.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("inagg_p4_run_bmv2", ROOT / "p4" / "tests" / "run_bmv2.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


RUNNER = _runner()
MISSING = [name for name, cmd in RUNNER.tools().items() if cmd is None]


@pytest.mark.skipif(bool(MISSING), reason=f"not found: {', '.join(MISSING)} (see p4/tests/run_bmv2.py)")
def test_simple_switch_answers_every_vector_as_the_model_does():
    report = RUNNER.run()
    assert report.ok, "\n".join(report.mismatches)

"""The Verilated RTL switch as a registered backend: entry point ``rtl`` of ``inagg.backends``.

:func:`~inagg.models.backend.load_backend` imports this module only when a
caller asks for ``rtl``, so the host library reaches the RTL without
importing the testbench.
"""

from __future__ import annotations

from inagg.models.backend import Backend
from inagg.testbench.bridge.realtime import RtlSwitch
from inagg.testbench.bridge.run import run_rtl

__all__ = ["BACKEND"]

BACKEND = Backend("rtl", open=RtlSwitch, run=run_rtl)

"""inagg: in-network aggregation of ML gradients.

The parts live in sub-packages: :mod:`inagg.models` (bit-exact numpy golden
models), :mod:`inagg.hdl` (Amaranth gateware), :mod:`inagg.testbench`
(cocotb testbenches), :mod:`inagg.host` (RoCEv2 hosts and schedules).
"""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("inagg")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["__version__"]

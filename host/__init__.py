"""The host side: RoCEv2 workers that all-reduce through an inagg switch.

``inagg.host.allreduce(array, group)`` is the worker API (:mod:`inagg.host.api`);
:mod:`inagg.host.worker` holds the sans-IO protocol, :mod:`inagg.host.fastpath`
the frame builder and parser, :mod:`inagg.host.roce` the scapy layers,
:mod:`inagg.host.controller` the job planner, and :mod:`inagg.host.memnet`,
:mod:`inagg.host.netns` and :mod:`inagg.host.tap` the transports.

The names below load on first use, so that ``inagg --help`` (which imports
:mod:`inagg.host.demo`) does not import numpy.
"""

import importlib

_EXPORTS = {
    "allreduce": "api", "Group": "api", "Port": "api", "MemoryFabric": "api", "reduce": "api", "broadcast": "api",
    "barrier": "api", "reduce_scatter": "api", "allgather": "api", "Collective": "api",
    "Timing": "worker", "ProtocolError": "worker", "ChunkTimeoutError": "worker", "LengthMismatchError": "worker",
    "RcRetryError": "rc_worker",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

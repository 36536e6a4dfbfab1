"""GPU-side collective schedules: an IR, generators, an executor and a cost model.

One representation (:class:`~inagg.host.schedules.ir.Schedule`, a table of
send / receive / receive-reduce / copy rows per step over buffer chunks) is
produced by every generator and is then executed and checked
(:mod:`.executor`), costed on a topology (:mod:`.cost`, :mod:`.topology`),
plotted, and exported to MSCCL's XML (:mod:`.msccl`, which also validates
such files and reads them back). :func:`generate` is the entry point by
algorithm name::

    from inagg.host.schedules import generate, check, evaluate, topology
    topo = topology.parse("torus:8x8")
    s = generate("swing-bw", topo=topo)
    check(s)
    print(evaluate(s, topo, 1 << 20).time_s)
"""

from inagg.host.schedules.cost import Cost, allreduce_lower_bound, evaluate, ina_lower_bound
from inagg.host.schedules.executor import ScheduleError, check, check_symbolic, execute, expected, make_inputs
from inagg.host.schedules.ir import Buffer, Collective, Op, OpKind, Row, Schedule, ScheduleBuilder
from inagg.host.schedules.registry import ALGORITHMS, applicable, generate

__all__ = [
    "ALGORITHMS", "Buffer", "Collective", "Cost", "Op", "OpKind", "Row", "Schedule", "ScheduleBuilder",
    "ScheduleError", "allreduce_lower_bound", "applicable", "check", "check_symbolic", "evaluate", "execute",
    "expected",
    "generate", "ina_lower_bound", "make_inputs",
]

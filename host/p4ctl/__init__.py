"""Control plane of the P4 programs in ``p4/``: table entries, multicast groups
and register layout from the job description that configures every other
implementation (:class:`~inagg.models.job.SwitchSpec`, :class:`~inagg.models.job.JobSpec`).

Pure Python, no P4 runtime needed to import or use it:

- :mod:`.layout` -- what the programs need, target-neutral (:func:`~.layout.plan`)
- :mod:`.bmv2` -- ``simple_switch_CLI`` commands for ``p4/v1model``
- :mod:`.bfrt` -- a ``bfrt_python`` script for ``p4/tna``
- :mod:`.vectors` -- PTF-style reference vectors from the P4 profile model
"""

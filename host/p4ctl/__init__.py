"""Control plane of the P4 programs in ``p4/``: table entries, multicast groups
and register layout from the job description that configures every other
implementation (:class:`~inagg.models.job.SwitchSpec`, :class:`~inagg.models.job.JobSpec`).

Pure Python, no P4 runtime needed to import or use it:

- :mod:`.layout` -- what the programs need, target-neutral (:func:`~.layout.plan`)
- :mod:`.bmv2` -- ``simple_switch_CLI`` commands for ``p4/v1model``, and
  :class:`~.bmv2.Switch`, which removes and adds one job on a running switch
- :mod:`.bfrt` -- ``bfrt_python`` scripts for ``p4/tna``: the whole
  configuration, or one job removed or added
- :mod:`.vectors` -- PTF-style reference vectors from the P4 profile model
"""

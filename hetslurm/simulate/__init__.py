"""Replay real workload traces through a model of Slurm as hetslurm configures it.

``traces`` reads the public traces, ``params`` the assumptions file, ``workload`` turns trace
jobs into each policy's requests, ``loop`` is the event-driven replay over the compiled
placement core with the backfill model as a plug-in (``easy``, ``slurm_backfill``),
``measures`` and ``run`` produce the figures. See docs/simulate.md.
"""

"""Replay real workload traces through a model of Slurm as hetslurm configures it.

``traces`` reads the public traces, ``params`` the assumptions file, ``workload`` turns trace
jobs into each policy's requests, ``engine`` is the event-driven FCFS + EASY backfill replay
over the compiled placement core, ``measures`` and ``run`` produce the figures. See
docs/simulate.md.
"""

"""The old import path of the EASY replay, kept while ``hetslurm.simulate.validate`` (moving to
the lab) imports it: the loop is :mod:`hetslurm.simulate.loop`, EASY backfill
:mod:`hetslurm.simulate.easy`."""

from hetslurm.simulate.easy import replay
from hetslurm.simulate.loop import Alloc, JobRecord, ReplayResult, Stats

__all__ = ["Alloc", "JobRecord", "ReplayResult", "Stats", "replay"]

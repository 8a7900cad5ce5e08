"""Decision rules shared by the rooms that judge jobs: ``audit`` reports by them, ``act``
acts by them, and the simulator will replay them (docs/architecture.md).

:mod:`.idle`: when a sample, and a whole job, is idle. :mod:`.stall`: what ``[stall]`` does
about a running job that is idle.
"""

"""The request room: what a ``#HET`` request says and what the hook decided about it.

The grammar and the meaning live once, in the Lua that slurmctld runs (``job_submit/``);
Python reads them through lupa (:mod:`hetslurm.placement.request` today). This package holds
the typed views Python works with: :mod:`hetslurm.request.record`, the hook's decision record.
"""

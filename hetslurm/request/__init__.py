"""The request room: what a ``#HET`` request says, what it means, and what the hook decided.

The grammar and the meaning live once, in the Lua that slurmctld runs (``job_submit/hetreq.lua``
and ``job_submit/hethook.lua``, installed as the package ``hetslurm_job_submit``; the Lua stays
in ``job_submit/`` because that is the folder an admin recognises as the job_submit plugin's).
Python runs that same Lua through lupa and turns the results into typed objects:

* :mod:`hetslurm.request.language` — :class:`Request` (what a job asks), ``parse_request``
  (the grammar), ``resolve`` (the hook's own meaning on a site: ordered models, memory floor,
  energy, CPU-only, partition and QOS), ``format_request`` (the canonical text);
* :mod:`hetslurm.request.record` — the hook's decision record, decoded once;
* :mod:`hetslurm.request._lua` — the one module that imports lupa.
"""

"""The admin's utilization audit: sacct plus GPU samples into named pandas tables.

:func:`hetslurm.audit.tables.audit` computes every table from two DataFrames (jobs from
sacct, samples from the metrics store or Prometheus) and the site; :mod:`.sacct` reads
accounting, :mod:`.report` renders tables, plots and HTML. The idle rule the tables apply is
:mod:`hetslurm.policy.idle`, shared with ``act``; the benchmark is in the lab.
"""

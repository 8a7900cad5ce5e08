"""The lab: benchmarks, timers, testbed experiments and demo helpers, apart from the product.

Nothing here is needed to run hetslurm. No product package imports this one
(``tests/unit/test_import_graph.py`` checks it, docs/architecture.md draws the rooms); only
the thin commands ``hetslurm bench ...`` and ``hetslurm simulate --validate`` reach it, by a
lazy import inside the command function.

* :mod:`.bench_placement`: ``bench placement``, the core's latency at 1k/10k nodes and on
  the Alibaba inventory;
* :mod:`.bench_hook`, :mod:`.luatimer`, :mod:`.hostile`: ``bench hook`` in-process and in
  slurmctld, the ``lua_pcall`` timer, the hostile-script corpus (also used by the tests);
* :mod:`.bench_audit`, :mod:`.peakrss`: ``bench audit`` on a synthetic month, and the
  child's own peak memory;
* :mod:`.bench_rebalance`, :mod:`.bench_simulate`, :mod:`.bench_testbed`: ``bench
  rebalance``, ``bench simulate``, ``bench testbed``;
* :mod:`.validate_placement`, :mod:`.validate_simulate`: does Slurm keep a placement; the
  simulator against the testbed (``simulate --validate``);
* :mod:`.synthetic_site`, :mod:`.demo_nvml`: a GPU site of any size; fake-NVML scripting for
  the demo scripts;
* :mod:`.child`: how the lab starts a Python child, on the installed package whatever the
  working directory.
"""

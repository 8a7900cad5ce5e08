"""GPU metrics: the node collector, NVML (real and fake), the segment store, the exporter.

Data flows one way: an :class:`~hetslurm.metrics.nvml.NvmlSource` reads devices, the
:class:`~hetslurm.metrics.collector.Collector` attributes each GPU to the Slurm job holding
it (Slurm index -> gres.conf ``File=`` -> device minor -> NVML, never by position) and
writes samples to a :class:`~hetslurm.metrics.store.SegmentStore`; the exporter and the
audit read them back. Only :mod:`hetslurm.metrics.nvml` imports ``pynvml``.

Importing this package imports neither pynvml nor pyarrow.
"""

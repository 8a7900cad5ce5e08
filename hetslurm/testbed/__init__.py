"""The local test cluster: real Slurm 22.05 daemons and accounting on one machine."""

from hetslurm.testbed.cluster import Testbed, UpResult, default_dir, default_site, running_site

__all__ = ["Testbed", "UpResult", "default_dir", "default_site", "running_site"]

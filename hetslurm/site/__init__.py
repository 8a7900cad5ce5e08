"""The site: one typed description of the cluster, and its rendering to Slurm configuration.

Nothing here talks to a running Slurm: loading and rendering are pure and deterministic.
"""

from hetslurm.site.load import load_site, parse_site
from hetslurm.site.model import Device, NodeSpec, Site

__all__ = ["Device", "NodeSpec", "Site", "load_site", "parse_site"]

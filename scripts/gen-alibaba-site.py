"""Print site-configs/alibaba-openb.toml from the Alibaba trace's node list.

    python scripts/gen-alibaba-site.py > site-configs/alibaba-openb.toml

The node list is read from $HETSLURM_TRACES (default ../shared/traces).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetslurm.simulate.traces import alibaba_site_toml, read_alibaba_nodes  # noqa: E402
from hetslurm.traces import traces_dir  # noqa: E402

REL = "alibaba-gpu-v2023/openb_node_list_all_node.csv"

if __name__ == "__main__":
    nodes = read_alibaba_nodes(traces_dir() / REL)
    print(alibaba_site_toml(nodes, f"$HETSLURM_TRACES/{REL}"), end="")

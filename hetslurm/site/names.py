"""Which names Slurm can take, enforced once for every name a site file introduces.

Device model names become a gres *type* (``Gres=gpu:a100:8``, ``--gres=gpu:a100:2``), a TRES
name (``gres/gpu:a100``) and a node *feature* (``--constraint=a100|h100``). The rule below is
the intersection that is safe in all three places:

* gres strings split on ``:`` and ``,`` and take ``(...)`` suffixes;
* constraint expressions treat ``& | [ ] ( ) * , !`` as operators, ``:`` introduces a count;
* Slurm stores TRES names case-insensitively, but ``--gres=gpu:A100`` does not match a type
  written ``a100`` in gres.conf, so mixed case only breeds mistakes.

Rule (documented in docs/site-config.md): a lowercase letter, then up to 30 lowercase
letters, digits or underscores (``^[a-z][a-z0-9_]{0,30}$``), and not one of the names
hetslurm itself adds as features (``gpu``, ``fpga``, ``cpu``).
"""

from __future__ import annotations

import re

MODEL_RE = re.compile(r"^[a-z][a-z0-9_]{0,30}$")
RESERVED_FEATURES = frozenset({"gpu", "fpga", "cpu"})

# Node names: what hostlist expressions and slurm.conf NodeName accept without quoting.
NODE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
# Partition, switch and class names appear unquoted in slurm.conf and topology.conf.
IDENT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a device model / feature name, or None if it can."""
    if name in RESERVED_FEATURES:
        return f"'{name}' is reserved: hetslurm adds it as a feature itself"
    if not MODEL_RE.match(name):
        hint = re.sub(r"[^a-z0-9_]", "_", name.lower())
        if not hint[:1].isalpha():
            hint = "m" + hint
        return (
            f"'{name}' cannot be a Slurm gres type and feature: use a lowercase letter, then "
            f"lowercase letters, digits or '_' (at most 31 characters), e.g. '{hint[:31]}'"
        )
    return None


def ident_problem(name: str, what: str) -> str | None:
    """Why ``name`` cannot be used as a ``what`` (partition, switch, ...), or None."""
    if not IDENT_RE.match(name):
        return (
            f"{what} name '{name}' must start with a letter and hold only letters, digits, "
            "'_' or '-' (at most 63 characters)"
        )
    return None

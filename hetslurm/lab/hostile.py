"""A hostile-input corpus for the job_submit hook: batch scripts and comments, each with its
exact outcome.

Every case says what the hook must do with it: leave the job ``unchanged``, write exactly
``fields``, or ``reject`` with exactly one message. Generated cases come from a seeded
generator that builds a script from floods whose line numbers and sizes it knows, so the
expected outcome follows from how the script was built (the header rules of
docs/directives.md), never from running the hook. Hand-written cases cover what a generator
would rarely hit: floods of the bytes a plain search stops at, NULs, CRLF, the 4 MB edge,
hetjob separators, the record marker.

Used whole in-process by tests/unit/test_hostile_scripts.py, as a subset of at most 200
through the real slurmctld by tests/cluster/test_hostile_live.py, and by ``hetslurm bench
hook``, which reports the corpus's slowest case (docs/security.md).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: What the hook reads of a script at most (Slurm's default max_script_size, hethook.lua).
MAX_SCRIPT = 4 * 1024 * 1024
#: Header lines the hook walks toward a #HET line at most (hethook.lua MAX_HEADER_LINES).
HEADER_CAP = 10_000
CAP_MESSAGE = (f"script line {HEADER_CAP + 1}: more than {HEADER_CAP} header lines before a "
               "line starting with #HET; put the #HET lines at the top of the script")
TOO_MANY_LINES = ("#HET line {n}: more than 64 #HET lines; a request has at most 32 words, "
                  "so put several on one line")
HETJOB = ("#HET line {n}: #HET lines after '#SBATCH hetjob' (line {sep}) would apply to the "
          "first component; give a later component its request with "
          "#SBATCH --comment=\"het: ...\"")
RESERVED = ("hetslurm: the text 'hetslurm:{{' is reserved for the hook's decision record in "
            "the job's {field}; remove it")
SEED = 20261202
SHEBANG = "#!/bin/sh\n"


@dataclass(frozen=True)
class Case:
    """One job and its exact outcome.

    ``kind`` is ``"unchanged"`` (no write, accepted), ``"fields"`` (``expect``: the exact
    fields written besides the decision record) or ``"reject"`` (``expect``: the one message).
    """

    name: str
    kind: str
    expect: Any
    script: str | None = None
    comment: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.script or "") + len(self.comment or "")

    def job(self) -> dict[str, Any]:
        """The job description the hook sees (script and comment as submitted)."""
        out: dict[str, Any] = {"user_name": "root"}
        if self.script is not None:
            out["script"] = self.script
        if self.comment is not None:
            out["comment"] = self.comment
        out.update(self.options)
        return out


def gres(n: int) -> dict[str, str]:
    return {"tres_per_node": f"gres:gpu:{n}"}


# Floods that neither end the header nor start a #HET line: (name, one line).
NEUTRAL = [
    ("comment", "#\n"),
    ("blank", "\n"),
    ("spaces", " \n"),
    ("tabs_cr", "\t\r\n"),
    ("indented", "   # x\n"),
    ("crlf", "#\r\n"),
    ("nul", "#\0\n"),
    ("sbatch", "#SBATCH --comment=x\n"),
    ("hetwords", "# hetjob packjob #SBATCH hetjob\n"),
    ("near", "#HE\n"),
    ("hash_het", "##HET gpus=1\n"),
    ("long", "#" + "z" * 1022 + "\n"),
    ("unicode", "# \u65e5\u672c\u8a9e \U0001f680\n"),
    ("het_lower", "#het gpus=1\n"),
    ("control", "#\x1b[31m\x7f\x01\n"),
]
# Body floods (after the header's end): anything, #HET lines included (they are ignored).
BODY = [
    ("echo", "echo x\n"),
    ("het", "#HET gpus=9\n"),
    ("hetx", "#HETX\n"),
    ("nul", "\0\n"),
    ("long", "b" * 1023 + "\n"),
    ("hetjob", "echo hetjob packjob\n"),
    ("blank", "\n"),
]


def _count(rnd: random.Random, unit: str, budget: int) -> int:
    """A flood size: mostly small, sometimes up to the byte budget (log-uniform)."""
    most = max(0, budget // len(unit.encode()))
    if most == 0:
        return 0
    return min(most, int(10 ** rnd.uniform(0, 7)))


def generated(n: int = 160, seed: int = SEED) -> Iterator[Case]:
    """Scripts built as: shebang, head flood, [#SBATCH hetjob], [#HET gpus=N], second head
    flood, a code line, body flood; the outcome follows from the line numbers."""
    rnd = random.Random(seed)  # noqa: S311 - a reproducible corpus, not secrets
    for i in range(n):
        hname, hunit = rnd.choice(NEUTRAL)
        h2name, h2unit = rnd.choice(NEUTRAL)
        bname, bunit = rnd.choice(BODY)
        budget = MAX_SCRIPT - 4096
        h = _count(rnd, hunit, budget // rnd.choice((1, 2, 4)))
        budget -= h * len(hunit.encode())
        h2 = _count(rnd, h2unit, budget // rnd.choice((2, 8, 64)))
        budget -= h2 * len(h2unit.encode())
        b = _count(rnd, bunit, budget)
        directive = rnd.random() < 0.8
        sep = rnd.random() < 0.1
        gpus = rnd.randint(1, 8)
        eol = rnd.choice(("\n", "\r\n", " \n", "\t\n"))
        parts = [SHEBANG, hunit * h]
        line = 1 + h  # the last line so far
        sep_line = None
        if sep:
            parts.append("#SBATCH hetjob\n")
            line += 1
            sep_line = line
        het_line = None
        if directive:
            parts.append(f"#HET gpus={gpus}{eol}")
            line += 1
            het_line = line
        parts.append(h2unit * h2)
        line += h2
        parts.append("true\n")
        code_line = line + 1
        parts.append(bunit * b)
        script = "".join(parts)
        body_candidates = b > 0 and bunit.startswith("#HET")
        # The hook walks toward #HET line starts and stops at the header's end (code_line):
        # past HEADER_CAP lines with one still ahead, the job is refused.
        # A directive after a hetjob separator is refused where it stands, before the walk
        # goes on.
        name = f"gen{i:03d}-{hname}{h}-{h2name}{h2}-{bname}{b}"
        read = het_line is not None and het_line <= HEADER_CAP
        if read and sep_line is not None:
            yield Case(name, "reject", HETJOB.format(n=het_line, sep=sep_line), script)
        elif (het_line is not None and not read) or (body_candidates
                                                      and code_line > HEADER_CAP):
            yield Case(name, "reject", CAP_MESSAGE, script)
        elif het_line is None:
            yield Case(name, "unchanged", None, script)
        else:
            yield Case(name, "fields", gres(gpus), script)


def hand_written() -> Iterator[Case]:
    """Edge cases with their outcomes worked out by hand."""
    big = MAX_SCRIPT - 64
    # Floods of the bytes a plain search stops at, on one line or many.
    for name, unit in (("H", "H"), ("hash", "#"), ("newline", "\n"), ("nl_hash_he", "\n#HE"),
                       ("hash_nl", "#\n"), ("space", " "), ("nul", "\0"), ("cr", "\r"),
                       ("het_word", "HET "), ("dollar", "$")):
        flood = unit * (big // len(unit))
        yield Case(f"flood_{name}", "unchanged", None, SHEBANG + flood)
        # the same flood as the header, then a directive: read where it is within the cap
        if unit.endswith("\n") and big // len(unit) > HEADER_CAP:
            yield Case(f"flood_{name}_then_het", "reject", CAP_MESSAGE,
                       SHEBANG + flood + "#HET gpus=1\n")
    # "#HETX" starts a #HET line for the search but is no directive.
    yield Case("hetx_20k", "reject", CAP_MESSAGE, SHEBANG + "#HETX\n" * 20_000 + "true\n")
    yield Case("hetx_5k_then_het", "fields", gres(1),
               SHEBANG + "#HETX\n" * 5_000 + "#HET gpus=1\ntrue\n")
    yield Case("hetx_flood_4mb", "reject", CAP_MESSAGE, SHEBANG + "#HETX\n" * (big // 6))
    # The walk's edge: a directive on line 10,000 is read, on line 10,001 refused.
    yield Case("het_on_line_10000", "fields", gres(3),
               SHEBANG + "#\n" * (HEADER_CAP - 2) + "#HET gpus=3\n")
    yield Case("het_on_line_10001", "reject", CAP_MESSAGE,
               SHEBANG + "#\n" * (HEADER_CAP - 1) + "#HET gpus=3\n")
    # A long header is fine when nothing lies ahead of the walk.
    yield Case("comment_flood_no_het", "unchanged", None, SHEBANG + "#\n" * (big // 2))
    yield Case("het_first_then_flood", "fields", gres(2),
               SHEBANG + "#HET gpus=2\n" + "#\n" * (big // 2 - 10))
    yield Case("code_then_het_flood", "unchanged", None,
               SHEBANG + "true\n" + "#HET gpus=1\n" * (big // 12))
    yield Case("het_then_body_het_flood", "fields", gres(1),
               SHEBANG + "#HET gpus=1\ntrue\n" + "#HET gpus=9\n" * (big // 12))
    # Past the 4 MB the hook reads: never read.
    filler = "#" + "z" * 1022 + "\n"
    past = SHEBANG + filler * (MAX_SCRIPT // len(filler) + 2) + "#HET gpus=4\ntrue\n"
    yield Case("past_4mb", "unchanged", None, past)
    inside = SHEBANG + filler * ((MAX_SCRIPT - 100) // len(filler)) + "#HET gpus=4\ntrue\n"
    yield Case("header_4mb_long_lines", "fields", gres(4), inside)
    yield Case("body_4mb", "fields", {"features": "cpu", "partition": "cpu"},
               SHEBANG + "#HET class=io\n" + ("echo " + "b" * 1018 + "\n") * 4090)
    # Many directive and #SBATCH lines.
    yield Case("directives_100k", "reject", TOO_MANY_LINES.format(n=66),
               SHEBANG + "#HET energy=normal\n" * 100_000 + "true\n")
    yield Case("empty_directives_100k", "reject", TOO_MANY_LINES.format(n=66),
               SHEBANG + "#HET\n" * 100_000 + "true\n")
    yield Case("sbatch_9998", "fields", gres(2),
               SHEBANG + "#SBATCH --comment=x\n" * 9_998 + "#HET gpus=2\ntrue\n")
    yield Case("sbatch_100k", "reject", CAP_MESSAGE,
               SHEBANG + "#SBATCH --comment=x\n" * 100_000 + "#HET gpus=2\n")
    yield Case("line_64k", "reject",
               "#HET line 2: the #HET lines hold more than 1024 bytes of request (the size of "
               "a Slurm comment); shorten them", SHEBANG + "#HET " + "gpus=1 " * 9362 + "\n")
    # hetjob separators and words.
    yield Case("hetjob_then_het", "reject", HETJOB.format(n=4, sep=3),
               SHEBANG + "#SBATCH -n 1\n#SBATCH hetjob\n#HET gpus=1\ntrue\n")
    yield Case("packjob_then_het", "reject", HETJOB.format(n=3, sep=2),
               SHEBANG + "#SBATCH\tpackjob\n#HET gpus=1\n")
    yield Case("het_then_hetjob", "fields", gres(1),
               SHEBANG + "#HET gpus=1\n#SBATCH hetjob\n#SBATCH -n 1\ntrue\n")
    yield Case("hetjob_words_flood", "fields", gres(1),
               SHEBANG + "#HET gpus=1\n" + "# hetjob packjob\n" * 200_000 + "echo hetjob\n")
    # NULs, CRLF, controls.
    yield Case("nul_in_directive", "reject",
               "#HET line 2: 'gpus=1?': GPUs per job must be a whole number from 0 to 65536",
               SHEBANG + "#HET gpus=1\0\n")
    yield Case("nul_after_het", "unchanged", None, SHEBANG + "#HET\0gpus=2\n")
    yield Case("nul_first_line", "unchanged", None, "\0\n#HET gpus=1\n")
    yield Case("crlf_script", "fields", gres(2),
               "#!/bin/sh\r\n#SBATCH -n 1\r\n#HET gpus=2\r\n\r\ntrue\r\n")
    yield Case("crlf_flood", "fields", gres(2),
               SHEBANG + "#\r\n" * 9_000 + "#HET gpus=2\r\n" + "#\r\n" * 1_000_000)
    # Comments: the other way in for a request, and the record's field.
    yield Case("comment_request", "fields", gres(1), comment="het: gpus=1")
    yield Case("comment_huge", "reject", "--comment het:: the request is 1050001 bytes; at most "
               "1024 (the size of a Slurm comment)", comment="het: " + "gpus=1 " * 150_000)
    yield Case("comment_nul", "reject", "--comment het:: 'gpus=1?': GPUs per job must be a "
               "whole number from 0 to 65536", comment="het: gpus=1\0")
    yield Case("comment_and_script", "reject",
               "#HET line 2: the job has #HET lines and a --comment starting with 'het:'; give "
               "the request once", SHEBANG + "#HET gpus=1\n", comment="het: gpus=2")
    yield Case("comment_plain_huge", "unchanged", None, SHEBANG + "true\n",
               comment="x" * 1_000_000)
    for i, text in enumerate(('hetslurm:{"set":"x"', 'hetslurm:{"v":1}', "a hetslurm:{")):
        yield Case(f"record_marker_{i}", "reject", RESERVED.format(field="admin_comment"),
                   SHEBANG + "#HET gpus=1\n", options={"admin_comment": text})


def cases(generated_n: int = 160, seed: int = SEED) -> list[Case]:
    """The whole corpus: hand-written cases, then the generated ones."""
    return [*hand_written(), *generated(generated_n, seed)]


def live_subset(corpus: list[Case], limit: int = 200) -> list[Case]:
    """At most ``limit`` cases for the real slurmctld: every hand-written script case that
    sbatch hands to slurmctld as it is (see sbatch_takes), then the largest generated ones."""
    usable = [c for c in corpus if c.script is not None and sbatch_takes(c.script)
              and not c.options and c.comment is None]
    hand = [c for c in usable if not c.name.startswith("gen")]
    gen = sorted((c for c in usable if c.name.startswith("gen")), key=lambda c: -c.size)
    return (hand + gen)[:limit]


def sbatch_takes(script: str) -> bool:
    """Whether sbatch sends ``script`` to slurmctld unchanged: it reads a script as a C string
    (no NUL), refuses DOS line breaks and a first line without "#!", turns "#SBATCH hetjob"
    into a heterogeneous job, and slurmctld refuses one over max_script_size."""
    data = script.encode()
    return (script.startswith("#!") and "\0" not in script and "\r\n" not in script
            and len(data) < MAX_SCRIPT - 1024
            and not any(w in script for w in ("#SBATCH hetjob", "#SBATCH\thetjob",
                                               "#SBATCH packjob", "#SBATCH\tpackjob")))

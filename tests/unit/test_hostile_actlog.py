"""Hostile-input corpus for the action log's reader and the run lock (issue 18, item 2).

Every class of hostile line has an exact oracle: the line is skipped and counted under one
reason of :data:`hetslurm.act.log.SKIP_REASONS`, or (for the lock and for files that are not
plain files) a specific error. A seeded generator mixes entries the real writer wrote with
hostile lines of every class; the oracle is that exactly the written entries come back, in
order, and the skip counts are exactly the hostile lines per class.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _act_fixtures import NOW, append_probe, cluster, ctx, job, samples

from hetslurm.act import ActError
from hetslurm.act.lock import RunLock
from hetslurm.act.log import KINDS, MAX_LINE, SKIP_REASONS, ActionLog, parse_line
from hetslurm.act.run import StallRequest, requeue_stalled
from hetslurm.act.stall import _warnings
from hetslurm.errors import PermissionsError

WARNING = {"kind": "warning", "logged_at": NOW, "t": NOW - 1800, "job": "1", "job_id": 1,
           "restarts": 0, "rule": "idle", "planned": "requeue", "not_before": NOW - 1}
NOTIFY = {"kind": "notify", "logged_at": NOW, "t": NOW - 1800, "job": "1", "job_id": 1,
          "restarts": 0, "rule": "idle", "action": "warn", "ok": True, "detail": ""}


def line(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True).encode() + b"\n"


def read(tmp_path: Path, data: bytes, kind: str | None = None,
         now: float | None = None) -> tuple[list[dict[str, Any]], Counter[str]]:
    log = ActionLog(tmp_path / "a.jsonl")
    log.path.write_bytes(data)
    log.path.chmod(0o640)
    got = list(log.entries(kind, now=now))
    return got, log.skipped


# Hand-written edge cases, one oracle each ---------------------------------------------------

BIG = "9" * 5000
CASES: list[tuple[str, bytes, str | None]] = [
    # (name, the line, the reason it is skipped; None: it is read)
    ("valid warning", line(WARNING), None),
    ("valid notify", line(NOTIFY), None),
    ("crlf ending", line(WARNING)[:-1] + b"\r\n", None),
    ("no t on a run entry", line({"kind": "run", "logged_at": 1.0}), None),
    ("torn last line", line(WARNING)[:40], "torn"),
    ("torn line closed by a later write", line(WARNING)[:40] + b"\n", "not_json"),
    ("empty line", b"\n", "not_json"),
    ("latin-1 byte", line(WARNING).replace(b'"idle"', b'"idl\xe9"'), "not_ascii"),
    ("utf-8 text", line({**WARNING, "rule": "idle\u00e9"}).replace(b"\\u00e9", "é".encode()),
     "not_ascii"),
    ("byte-order mark", b"\xef\xbb\xbf" + line(WARNING), "not_ascii"),
    ("invalid utf-8", b"\xff\xfe" + line(WARNING), "not_ascii"),
    ("NUL bytes only", b"\0" * 64 + b"\n", "not_json"),
    ("NUL inside a string", line(WARNING).replace(b'"idle"', b'"id\0le"'), "not_json"),
    ("NUL after the object", line(WARNING)[:-1] + b"\0\n", "not_json"),
    ("zero-filled tail after a power cut", b"\0" * 4096, "torn"),
    ("deep nesting", b"[" * 200_000 + b"\n", "not_json"),
    ("integer past the digit limit", f'{{"kind":"run","logged_at":{BIG}}}\n'.encode(),
     "not_json"),
    ("a list", b"[1, 2]\n", "not_object"),
    ("a string", b'"warning"\n', "not_object"),
    ("null", b"null\n", "not_object"),
    ("a number", b"12\n", "not_object"),
    ("no kind", line({k: v for k, v in WARNING.items() if k != "kind"}), "bad_kind"),
    ("unknown kind", line({**WARNING, "kind": "execute"}), "bad_kind"),
    ("kind not a string", line({**WARNING, "kind": 3}), "bad_kind"),
    ("kind a list", line({**WARNING, "kind": ["warning"]}), "bad_kind"),
    ("no logged_at", line({k: v for k, v in WARNING.items() if k != "logged_at"}),
     "bad_field"),
    ("logged_at a string", line({**WARNING, "logged_at": "1800000000"}), "bad_field"),
    ("logged_at true", line({**WARNING, "logged_at": True}), "bad_field"),
    ("t NaN", line(WARNING).replace(f'"t": {NOW - 1800}'.encode(), b'"t": NaN'), "bad_field"),
    ("t Infinity", line(WARNING).replace(f'"t": {NOW - 1800}'.encode(), b'"t": -Infinity'),
     "bad_field"),
    ("t 1e400", line(WARNING).replace(f'"t": {NOW - 1800}'.encode(), b'"t": 1e400'),
     "bad_field"),
    ("t a huge integer", line(WARNING).replace(f'"t": {NOW - 1800}'.encode(),
                                               b'"t": 1' + b"0" * 400), "bad_field"),
    ("t null on a run entry", line({"kind": "run", "logged_at": 1.0, "t": None}), "bad_field"),
    ("warning without t", line({k: v for k, v in WARNING.items() if k != "t"}), "bad_field"),
    ("job_id a string", line({**WARNING, "job_id": "1"}), "bad_field"),
    ("job_id true", line({**WARNING, "job_id": True}), "bad_field"),
    ("job_id negative", line({**WARNING, "job_id": -1}), "bad_field"),
    ("job_id a float", line({**WARNING, "job_id": 1.5}), "bad_field"),
    ("job_id an object", line({**WARNING, "job_id": {"id": 1}}), "bad_field"),
    ("restarts missing", line({k: v for k, v in WARNING.items() if k != "restarts"}),
     "bad_field"),
    ("notify ok a string", line({**NOTIFY, "ok": "yes"}), "bad_field"),
    ("notify ok 1", line({**NOTIFY, "ok": 1}), "bad_field"),
    ("notify rule a number", line({**NOTIFY, "rule": 5}), "bad_field"),
]


@pytest.mark.parametrize(("data", "reason"), [(c[1], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_edge_case(tmp_path: Path, data: bytes, reason: str | None) -> None:
    got, skipped = read(tmp_path, data)
    if reason is None:
        assert len(got) == 1 and skipped == Counter()
    else:
        assert got == [] and skipped == Counter({reason: 1})
    assert parse_line(data)[1] == ("" if reason is None else reason)


def test_line_length_limit_is_exact(tmp_path: Path) -> None:
    head = line({"kind": "run", "logged_at": 1.0, "pad": ""})[:-3]  # ... "pad": "
    fits = head + b"x" * (MAX_LINE - len(head) - 3) + b'"}\n'
    over = head + b"x" * (MAX_LINE - len(head) - 2) + b'"}\n'
    assert len(fits) == MAX_LINE and len(over) == MAX_LINE + 1
    got, skipped = read(tmp_path, fits + over + line(WARNING))
    assert [e["kind"] for e in got] == ["run", "warning"]
    assert skipped == Counter({"too_long": 1})


def test_huge_lines_are_read_in_bounded_pieces(tmp_path: Path) -> None:
    # 8 MiB with no newline between two entries, then 3 MiB at the end without one.
    data = line(WARNING) + b"{" * (8 << 20) + b"\n" + line(NOTIFY) + b"x" * (3 << 20)
    got, skipped = read(tmp_path, data)
    assert [e["kind"] for e in got] == ["warning", "notify"]
    assert skipped == Counter({"too_long": 2})


def test_entries_from_the_future_are_skipped_given_the_clock(tmp_path: Path) -> None:
    future = line({**WARNING, "t": NOW + 3600})
    at_now = line({**WARNING, "t": NOW})
    got, skipped = read(tmp_path, line(WARNING) + future + at_now, now=NOW)
    assert [e["t"] for e in got] == [NOW - 1800, NOW] and skipped == Counter({"future": 1})
    # Without a clock (a report of the whole log) they are read.
    got, skipped = read(tmp_path, line(WARNING) + future, now=None)
    assert len(got) == 2 and not skipped


def test_a_future_warning_does_not_mask_the_real_one(tmp_path: Path) -> None:
    # Before: the latest warning was taken whatever its date, so a clock that jumped ahead
    # (or a forged line) kept the job "warned in the future" and never acted on.
    log = ActionLog(tmp_path / "a.jsonl")
    log.path.write_bytes(line(WARNING) + line({**WARNING, "t": NOW + 10 * 86400}))
    log.path.chmod(0o640)
    assert _warnings(log, NOW) == {(1, 0): NOW - 1800}
    c = ctx(action_log=str(log.path), lock_file=str(tmp_path / "lock"))
    res = requeue_stalled(cluster(job(1)), StallRequest(apply=False),
                          samples=samples({1: 0.0}), now=NOW, output_probe=append_probe,
                          context=c)
    assert [d.action for d in res.decisions] == ["requeue"]
    assert res.problems == [f"action log {log.path}: 1 line(s) skipped: future 1"]


def test_duplicate_entries_count_once(tmp_path: Path) -> None:
    log = ActionLog(tmp_path / "a.jsonl")
    log.path.write_bytes(line(WARNING) * 3 + line(NOTIFY) * 2)
    log.path.chmod(0o640)
    assert len(list(log.entries())) == 5 and not log.skipped  # read as they are...
    assert _warnings(log, NOW) == {(1, 0): NOW - 1800}  # ...and keyed by every reader
    c = ctx(action_log=str(log.path), lock_file=str(tmp_path / "lock"))
    res = requeue_stalled(cluster(job(1)), StallRequest(apply=False),
                          samples=samples({1: 0.0}), now=NOW, output_probe=append_probe,
                          context=c)
    assert [d.action for d in res.decisions] == ["requeue"] and res.problems == []


def test_duplicate_keys_take_the_last_value(tmp_path: Path) -> None:
    data = b'{"kind": "run", "kind": "warning", "logged_at": 1, "t": 1, "job_id": 1, ' \
           b'"restarts": 0}\n'
    got, skipped = read(tmp_path, data)
    assert [e["kind"] for e in got] == ["warning"] and not skipped


def test_a_run_reports_what_it_skipped_in_one_problem(tmp_path: Path) -> None:
    log = ActionLog(tmp_path / "a.jsonl")
    log.path.write_bytes(b"[]\n" + line({**WARNING, "t": NOW + 1}) * 2 + line(WARNING)[:30])
    log.path.chmod(0o640)
    c = ctx(action_log=str(log.path), lock_file=str(tmp_path / "lock"))
    res = requeue_stalled(cluster(job(1)), StallRequest(apply=False),
                          samples=samples({1: 0.0}), now=NOW, output_probe=append_probe,
                          context=c)
    assert res.problems == [f"action log {log.path}: 4 line(s) skipped: "
                            "torn 1, not_object 1, future 2"]


@pytest.mark.parametrize("what", ["fifo", "folder", "dangling symlink"])
def test_an_action_log_that_is_not_a_file_is_refused_without_hanging(tmp_path: Path,
                                                                     what: str) -> None:
    p = tmp_path / "a.jsonl"
    if what == "fifo":
        os.mkfifo(p)
    elif what == "folder":
        p.mkdir()
    else:
        p.symlink_to(tmp_path / "nowhere")
    why = "it is a symlink" if what == "dangling symlink" else "it is not a regular file"
    with pytest.raises(PermissionsError, match=why):
        list(ActionLog(p).entries())


# The seeded generator -----------------------------------------------------------------------


def _valid(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(KINDS)
    entry: dict[str, Any] = {"t": NOW - rng.uniform(0, 86400), "job": str(rng.randint(1, 99))}
    if kind in ("warning", "notify"):
        entry.update(job_id=rng.randint(1, 10**7), restarts=rng.randint(0, 5),
                     rule=rng.choice(["idle", "over-cap", "x" * rng.randint(1, 40)]))
    if kind == "notify":
        entry["ok"] = rng.random() < 0.5
    if rng.random() < 0.3:
        entry["detail"] = "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(20))
    return {"kind": kind, **entry}


def _hostile(rng: random.Random, reason: str) -> bytes:
    good = _valid(rng)
    good["logged_at"] = NOW
    text = line(good)
    if reason == "not_ascii":
        i = rng.randrange(1, len(text) - 2)
        return text[:i] + bytes([rng.randint(0x80, 0xFF)]) + text[i:]
    if reason == "too_long":
        return b'{"kind": "run", "x": "' + b"y" * rng.randint(MAX_LINE, MAX_LINE + 9999) + \
            b'"}\n'
    if reason == "not_json":
        i = rng.randrange(0, len(text) - 1)
        return rng.choice([text[:i] + b"\0" + text[i:], text[:i] + b"\n" if i else b"\n"])
    if reason == "not_object":
        return line(rng.choice([[], [good], "warning", 7, 1.5, None, True]))
    if reason == "bad_kind":
        bad = rng.choice([None, 7, "", "Warning", "warnings", ["warning"], {"k": 1}])
        return line({**good, "kind": bad}) if bad is not None else line(
            {k: v for k, v in good.items() if k != "kind"})
    if reason == "bad_field":
        target = rng.choice(["logged_at", "t", "job_id", "restarts"])
        numeric = target in ("logged_at", "t")  # any finite number is a valid time
        value = rng.choice(["1", True, None, [1], {"v": 1}, "x" if numeric else -1])
        return line({**good, "kind": "warning", "job_id": 1, "restarts": 0, target: value})
    if reason == "future":
        return line({**good, "t": NOW + rng.uniform(0.001, 10**6)})
    raise AssertionError(reason)


@pytest.mark.parametrize("seed", range(40))
def test_seeded_mix(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    log = ActionLog(tmp_path / "a.jsonl")
    written: list[dict[str, Any]] = []
    want: Counter[str] = Counter()
    for _ in range(rng.randint(0, 30)):
        if rng.random() < 0.5:
            entry = _valid(rng)
            written.append(log.append(entry.pop("kind"), entry))
        else:
            reasons = [r for r in SKIP_REASONS if r != "torn"]
            if want["too_long"]:
                reasons.remove("too_long")  # one 1 MiB line per file keeps the corpus fast
            reason = rng.choice(reasons)
            want[reason] += 1
            with open(log.path, "ab") as fh:
                fh.write(_hostile(rng, reason))
    if rng.random() < 0.3:  # a crash mid-write as the last thing in the file
        with open(log.path, "ab") as fh:
            fh.write(line(_valid(rng) | {"logged_at": NOW})[: rng.randint(1, 30)])
        want["torn"] += 1
    if not log.path.exists():
        log.path.write_bytes(b"")
    log.path.chmod(0o640)
    got = list(log.entries(now=NOW))
    assert got == written
    assert log.skipped == want
    # Every kind filter sees the same file, so the counts do not depend on it.
    for kind in KINDS:
        assert list(log.entries(kind, now=NOW)) == [e for e in written if e["kind"] == kind]
        assert log.skipped == want


# The lock file ------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"1\n", b"4194304\n", b"123", b"1234567890\n"],
                         ids=["empty", "pid", "big pid", "no newline", "ten digits"])
def test_lock_files_holding_a_pid_are_taken(tmp_path: Path, content: bytes) -> None:
    lock = tmp_path / "lock"
    lock.write_bytes(content)
    lock.chmod(0o600)
    with RunLock(lock):
        assert lock.read_bytes() == f"{os.getpid()}\n".encode()


@pytest.mark.parametrize("content", [
    b"abc\n", b" 12\n", b"12\n\n", b"12\n13\n", b"12345678901\n", b"\0\0\0\0",
    b"root:x:0:0:root:/root:/bin/bash\n", b"\xff\xfe1\n", b"1" * 4096,
], ids=["word", "space", "blank after", "two pids", "eleven digits", "NULs", "passwd",
        "binary", "4 KiB of digits"])
def test_lock_files_holding_anything_else_are_refused_and_left(tmp_path: Path,
                                                             content: bytes) -> None:
    lock = tmp_path / "lock"
    lock.write_bytes(content)
    lock.chmod(0o600)
    with pytest.raises(PermissionsError, match="holds something other than a pid"):
        RunLock(lock).acquire()
    assert lock.read_bytes() == content


def test_a_lock_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "lock", 0o600)
    with pytest.raises(PermissionsError, match="not a regular file"):
        RunLock(tmp_path / "lock").acquire()


def test_a_lock_that_is_a_folder_or_dangling_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(ActError, match="cannot open lock file"):
        RunLock(tmp_path / "dir").acquire()
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(PermissionsError, match="symlink"):
        RunLock(tmp_path / "link").acquire()
    assert not (tmp_path / "nowhere").exists()

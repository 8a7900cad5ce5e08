"""Trace readers: good rows, malformed rows with clear errors, and the real traces when the
shared folder is there."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from hetslurm.simulate.traces import (
    TraceError,
    alibaba_site_toml,
    read_alibaba_nodes,
    read_trace,
)
from hetslurm.site.load import load_site
from hetslurm.traces import traces_dir

ALI_HEAD = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time\n")
SWF_LINE = "1 10 -1 100 8 -1 -1 8 -1 -1 1 1 1 -1 1 -1 -1 -1\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_alibaba_rows(tmp_path: Path) -> None:
    p = write(tmp_path, "pods.csv", ALI_HEAD
              + "p1,12000,16384,1,460,,LS,Running,100,1100,150\n"
              + "p0,500,1024,0,0,,BE,Succeeded,50,80,60\n"
              + "p2,1000,1024,1,1000,,LS,Pending,70,,\n")
    t = read_trace(p, "alibaba")
    assert [j.id for j in t.jobs] == ["p0", "p1"]
    p0, p1 = t.jobs
    assert (p0.submit, p0.duration, p0.gpus, p0.cores, p0.qos) == (0, 20, 0, 1, "BE")
    assert (p1.submit, p1.duration, p1.gpus, p1.gpu_milli, p1.cores) == (50, 950, 1, 460, 12)
    assert t.skipped == {"never_scheduled": 1}


@pytest.mark.parametrize(("row", "message"), [
    ("p1,12000,16384,one,460,,LS,Running,100,1100,150\n",
     "field 'num_gpu' = 'one' is not a number"),
    ("p1,12000,16384,1,1460,,LS,Running,100,1100,150\n", "field 'gpu_milli' = 1460"),
    ("p1,12000,16384,1,460,,LS,Running,100,90,150\n", "is before scheduled_time"),
    ("p1,12000,16384,1,460,,LS\n", "7 fields, header has 11"),
    ("p1,12000,16384,-1,460,,LS,Running,100,1100,150\n", "out of range"),
])
def test_alibaba_malformed(tmp_path: Path, row: str, message: str) -> None:
    p = write(tmp_path, "pods.csv", ALI_HEAD + row)
    with pytest.raises(TraceError, match=message) as e:
        read_trace(p, "alibaba")
    assert f"{p}:2:" in str(e.value)


def test_alibaba_header_checked(tmp_path: Path) -> None:
    p = write(tmp_path, "pods.csv", "name,cpu_milli\np,1\n")
    with pytest.raises(TraceError, match="header lacks column"):
        read_trace(p, "alibaba")


def test_alibaba_nodes(tmp_path: Path) -> None:
    p = write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\n"
              "n0,32000,262144,0,\nn1,96000,786432,8,V100M32\n")
    nodes = read_alibaba_nodes(p)
    assert [(n.name, n.cores, n.gpus, n.model) for n in nodes] == [
        ("n0", 32, 0, None), ("n1", 96, 8, "V100M32")]
    bad = write(tmp_path, "bad.csv", "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,1,8,\n")
    with pytest.raises(TraceError, match="'model' is empty on a node with GPUs"):
        read_alibaba_nodes(bad)


def test_philly(tmp_path: Path) -> None:
    p = write(tmp_path, "philly.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n"
              "2017-10-09 07:01:55,66.0,1,66.0,a\n2017-10-09 06:13:03,2951.0,8,1,b\n")
    t = read_trace(p, "philly")
    assert [(j.submit, j.duration, j.gpus) for j in t.jobs] == [(0, 2951, 8), (2932, 66, 1)]
    bad = write(tmp_path, "bad.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n"
                "yesterday,66.0,1,66.0,a\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: field 'timestamp' = 'yesterday'"):
        read_trace(bad, "philly")
    zero = write(tmp_path, "zero.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n"
                 "2017-10-09 07:01:55,66.0,0,66.0,a\n")
    with pytest.raises(TraceError, match="'num_gpus' = '0' is out of range"):
        read_trace(zero, "philly")


def test_gavel(tmp_path: Path) -> None:
    line = "A3C\tcd x && python3 main.py\t--max-steps\t1\t2000\t{t}\t{g}\n"
    p = write(tmp_path, "x.trace", line.format(t="5.5", g=2) + line.format(t="0", g=1))
    t = read_trace(p, "gavel")
    assert [(j.submit, j.gpus, j.steps, j.job_type) for j in t.jobs] == [
        (0, 1, 2000, "A3C"), (5.5, 2, 2000, "A3C")]
    bad = write(tmp_path, "bad.trace", "A3C\tcmd\t1\t2000\t0\t1\n")
    with pytest.raises(TraceError, match=r"bad\.trace:1: 6 tab-separated fields, expected 7"):
        read_trace(bad, "gavel")
    bad2 = write(tmp_path, "bad2.trace", line.format(t="soon", g=1))
    with pytest.raises(TraceError, match="'arrival_time' = 'soon'"):
        read_trace(bad2, "gavel")


def test_swf_plain_and_zipped(tmp_path: Path) -> None:
    text = "; comment\n" + SWF_LINE + "2 20 -1 -1 8 -1 -1 8 -1 -1 1 1 1 -1 1 -1 -1 -1\n"
    p = write(tmp_path, "log.swf", text)
    t = read_trace(p, "swf")
    assert [(j.submit, j.duration, j.cores, j.gpus) for j in t.jobs] == [(0, 100, 8, 0)]
    assert t.skipped == {"no_runtime": 1}
    z = tmp_path / "log.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("log.swf", text)
    assert read_trace(z, "swf").jobs == t.jobs
    bad = write(tmp_path, "bad.swf", "1 10 -1 100 8\n")
    with pytest.raises(TraceError, match=r"bad\.swf:1: 5 fields, SWF has 18"):
        read_trace(bad, "swf")


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown trace format 'csv'"):
        read_trace(tmp_path / "x", "csv")
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "x", "philly")
    empty = write(tmp_path, "e.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n")
    with pytest.raises(TraceError, match="no replayable job"):
        read_trace(empty, "philly")


REAL = traces_dir()
needs_traces = pytest.mark.skipif(
    not REAL.is_dir(), reason=f"shared traces not found at {REAL} (set HETSLURM_TRACES)")


@needs_traces
def test_real_traces_read() -> None:
    ali = read_trace(REAL / "alibaba-gpu-v2023" / "openb_pod_list_default.csv", "alibaba")
    assert len(ali.jobs) + ali.skipped["never_scheduled"] == 8152
    assert sum(j.gpu_milli < 1000 for j in ali.jobs if j.gpus) > 0
    nodes = read_alibaba_nodes(REAL / "alibaba-gpu-v2023" / "openb_node_list_all_node.csv")
    assert len(nodes) == 1523 and sum(n.gpus for n in nodes) == 6212
    gavel = read_trace(REAL / "gavel" / "msr_seed0" / "0e4a51.trace", "gavel")
    assert all(j.steps and j.job_type for j in gavel.jobs)
    swf = read_trace(REAL / "pwa-swf" / "NASA-iPSC-1993-3.1-cln.swf.zip", "swf")
    assert len(swf.jobs) + sum(swf.skipped.values()) == 18239


@needs_traces
def test_real_philly_reads() -> None:
    t = read_trace(REAL / "sia-philly" / "philly.csv", "philly")
    assert len(t.jobs) == 82247
    assert max(j.gpus for j in t.jobs) == 128


def test_alibaba_site_from_a_node_list(tmp_path: Path) -> None:
    p = write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\n"
              "a0,32000,262144,0,\na1,96000,786432,8,G2\na2,96000,786432,8,G2\n"
              "a3,32000,262144,0,\na4,8000,32768,1,V100M16\n")
    text = alibaba_site_toml(read_alibaba_nodes(p), "nodes.csv")
    site = write(tmp_path, "site.toml", text)
    s = load_site(site)
    # One class per distinct node; nodes in the list's order (slurm.conf order).
    assert [(n.name, n.class_name) for n in s.nodes] == [
        ("a0", "cpu_c32_m256g"), ("a1", "g2x8_c96_m768g"), ("a2", "g2x8_c96_m768g"),
        ("a3", "cpu_c32_m256g"), ("a4", "v100m16x1_c8_m32g")]
    assert s.partitions["cpu"].nodes == ("a0", "a3")
    assert s.partitions["gpu"].nodes == ("a1", "a2", "a4")
    assert s.gpu_models() == ("v100m16", "g2")
    assert set(s.sections["classes"]) == {"vision", "language", "recommendation", "rl",
                                          "preprocess"}
    bad = write(tmp_path, "bad.csv", "sn,cpu_milli,memory_mib,gpu,model\nb,8000,1024,1,H100\n")
    with pytest.raises(TraceError, match="GPU model 'H100' has no site name"):
        alibaba_site_toml(read_alibaba_nodes(bad), "bad.csv")


def test_committed_alibaba_site_is_the_generated_one() -> None:
    nodes = traces_dir() / "alibaba-gpu-v2023" / "openb_node_list_all_node.csv"
    if not nodes.is_file():
        pytest.skip(f"{nodes} missing (set HETSLURM_TRACES)")
    committed = Path(__file__).resolve().parents[2] / "site-configs" / "alibaba-openb.toml"
    got = alibaba_site_toml(read_alibaba_nodes(nodes),
                            "$HETSLURM_TRACES/alibaba-gpu-v2023/openb_node_list_all_node.csv")
    assert committed.read_text() == got, "rerun: python scripts/gen-alibaba-site.py > " \
        "site-configs/alibaba-openb.toml"
    site = load_site(committed)
    assert len(site.nodes) == 1523
    assert sum(len(n.gpus) for n in site.nodes) == 6212


def _compressed(tmp_path: Path, name: str, data: bytes, kind: str) -> Path:
    import bz2
    import gzip
    import lzma

    p = tmp_path / f"{name}.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(name, data)
    else:
        p.write_bytes({"gz": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress}[kind](data))
    return p


@pytest.mark.parametrize("kind,name", [("gz", "gzip"), ("xz", "xz"), ("bz2", "bzip2"),
                                       ("zip", "zip")])
def test_every_format_reads_compressed(tmp_path: Path, kind: str, name: str) -> None:
    # A Parallel Workloads Archive log as it is distributed (.swf.gz) read as "1 fields" once.
    swf = (";  Version: 2.2\n" + SWF_LINE + "2 20 -1 50 4 -1 -1 4 -1 -1 1 2 1 -1 1 -1 -1 -1\n")
    ali = (ALI_HEAD + "p1,12000,16384,1,1000,T4,LS,Running,100,1100,150\n"
           + "p0,500,1024,0,0,,BE,Succeeded,50,80,60\n")
    philly = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-03 10:00:00,60,2,120,vc1\n"
    for fmt, base, text in (("swf", "log.swf", swf), ("alibaba", "pods.csv", ali),
                            ("philly", "philly.csv", philly)):
        plain = read_trace(write(tmp_path, base, text), fmt)
        packed = read_trace(_compressed(tmp_path, base, text.encode(), kind), fmt)
        assert packed.jobs == plain.jobs and packed.compression == name
        assert plain.compression is None
        assert packed.unused_columns == plain.unused_columns


def test_compressed_traces_refused_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    import gzip

    import hetslurm.simulate.traces as traces

    bad = tmp_path / "cut.swf.gz"
    bad.write_bytes(gzip.compress(SWF_LINE.encode() * 50)[:-12])
    with pytest.raises(TraceError, match=r"cut\.swf\.gz: not a readable gzip file"):
        read_trace(bad, "swf")
    # A small file that inflates past the bound is refused before it is inflated whole.
    monkeypatch.setattr(traces, "MAX_DATA_BYTES", 4096)
    bomb = tmp_path / "bomb.swf.gz"
    bomb.write_bytes(gzip.compress(b";" * 100_000))
    assert bomb.stat().st_size < 4096
    with pytest.raises(TraceError, match="inflates to more than 4096 bytes"):
        read_trace(bomb, "swf")
    two = tmp_path / "two.zip"
    with zipfile.ZipFile(two, "w") as z:
        z.writestr("a.txt", "x")
        z.writestr("b.txt", "y")
    with pytest.raises(TraceError, match=r"two\.zip: the zip holds 2 files and none ends in "
                                         r"\.swf"):
        read_trace(two, "swf")


def test_unused_columns_are_named(tmp_path: Path) -> None:
    ali = read_trace(write(tmp_path, "pods.csv", ALI_HEAD.replace("\n", ",note\n")
                           + "p1,1000,1024,1,1000,,LS,Running,1,2,1,hello\n"), "alibaba")
    assert ali.unused_columns == ("pod_phase", "note")
    philly = read_trace(write(tmp_path, "p.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n"
                              "2017-10-03 10:00:00,60,2,120,vc1\n"), "philly")
    assert philly.unused_columns == ("gpu_time", "cluster")
    # SWF: a field not read counts as carried only where a row gives it a value (not -1).
    swf = read_trace(write(tmp_path, "l.swf", SWF_LINE), "swf")
    assert swf.unused_columns == ("status", "user", "group", "queue")


def test_alibaba_gpu_spec(tmp_path: Path) -> None:
    p = write(tmp_path, "pods.csv", ALI_HEAD
              + "p1,1000,1024,1,1000,V100M16|V100M32,LS,Running,1,2,1\n"
              + "p2,1000,1024,1,1000, T4 ,LS,Running,1,2,1\n"
              + "p3,1000,1024,0,0,T4,LS,Running,1,2,1\n"
              + "p4,1000,1024,1,1000,,LS,Running,1,2,1\n")
    by = {j.id: j.gpu_models for j in read_trace(p, "alibaba").jobs}
    # A CPU-only pod's spec constrains nothing; empty: any model.
    assert by == {"p1": ("V100M16", "V100M32"), "p2": ("T4",), "p3": (), "p4": ()}
    bad = write(tmp_path, "bad.csv", ALI_HEAD + "p1,1000,1024,1,1000,T4;rm,LS,Running,1,2,1\n")
    with pytest.raises(TraceError, match=r"bad\.csv:2: field 'gpu_spec' = 'T4;rm': 'T4;rm' is "
                                         "not a GPU model name"):
        read_trace(bad, "alibaba")

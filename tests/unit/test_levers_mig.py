"""The MIG lever: profile validation per card, rendering as typed gres with gres.conf
``MultipleFiles=`` lines, emulated capability files, and the loader's errors (file, key,
line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetslurm.errors import ConfigError
from hetslurm.site import levers as lv
from hetslurm.site.load import parse_site
from hetslurm.site.render import MIG_CAP_MAJOR, Runtime, device_files, render

ROOT = Path(__file__).resolve().parents[2]
MIG = ROOT / "tests" / "data" / "levers" / "mig.toml"
BASE = MIG.read_text()
SPLIT = 'a100 = ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]'


def edit(old: str, new: str, text: str = BASE) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


@pytest.mark.parametrize(("card", "profiles"), [
    ("A100-40GB", ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb",
                   "7g.40gb"]),
    ("A100-80GB", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                   "7g.80gb"]),
    ("H100-80GB", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                   "7g.80gb"]),
])
def test_known_profiles_are_nvidias(card: str, profiles: list[str]) -> None:
    assert list(lv.MIG_CARDS[card].profiles) == profiles


def test_card_follows_memory_then_name() -> None:
    assert lv.mig_card("a100", None) is lv.MIG_CARDS["A100-40GB"]
    assert lv.mig_card("a100", 80 * 1024) is lv.MIG_CARDS["A100-80GB"]
    assert lv.mig_card("a100_80gb", None) is lv.MIG_CARDS["A100-80GB"]
    assert lv.mig_card("h100", None) is lv.MIG_CARDS["H100-80GB"]
    assert lv.mig_card("v100", None) is None


@pytest.mark.parametrize(("model", "profiles"), [
    ("a100", ["7g.40gb"]),
    ("a100", ["4g.20gb", "3g.20gb"]),
    ("a100", ["1g.5gb"] * 7),
    ("a100", ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]),
    ("h100", ["3g.40gb", "3g.40gb"]),
    ("h100", ["1g.10gb+me", "1g.10gb", "2g.20gb", "3g.40gb"]),
])
def test_possible_splits_pass(model: str, profiles: list[str]) -> None:
    assert lv.mig_problem(model, profiles, None) is None


@pytest.mark.parametrize(("model", "profiles", "words"), [
    ("a100", ["4g.20gb", "4g.20gb"], "at most 1"),
    ("a100", ["3g.20gb", "3g.20gb", "1g.5gb", "1g.5gb"], "8 compute slices"),
    ("a100", ["1g.10gb"] * 4 + ["1g.5gb"], "45 GB; a A100-40GB has 40 GB"),
    ("a100", ["3g.40gb"], "not a MIG profile of the A100-40GB"),
    ("a100", [], "at least one"),
    ("v100", ["1g.5gb"], "no MIG profiles are known for 'v100'"),
])
def test_impossible_splits_are_refused(model: str, profiles: list[str], words: str) -> None:
    problem = lv.mig_problem(model, profiles, None)
    assert problem is not None and words in problem, problem


def test_type_names_follow_the_model_name_rule() -> None:
    assert lv.mig_type("a100", "3g.20gb") == "a100_3g_20gb"
    assert lv.mig_type("h100", "1g.10gb+me") == "h100_1g_10gb_me"
    long = "a100" + "x" * 24  # 28 characters: its MIG type would pass 31
    assert "at most 31" in (lv.mig_problem(long, ["1g.5gb"], None) or "")


def test_mig_renders_typed_gres_tres_and_multiple_files() -> None:
    site = parse_site(BASE)
    files = render(site)
    nodes = files["hetslurm-nodes.conf"]
    assert ("NodeName=mig1 CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 "
            "RealMemory=4096 Gres=gpu:a100_3g_20gb:2,gpu:a100_2g_10gb:2,gpu:a100_1g_5gb:4 "
            "Feature=gpu,a100 ") in nodes
    assert "Gres=gpu:h100:1 " in nodes
    glob = files["hetslurm-globals.conf"]
    assert ("AccountingStorageTRES=gres/gpu,gres/gpu:h100,gres/gpu:a100,gres/fpga,"
            "gres/gpu:a100_3g_20gb,gres/gpu:a100_2g_10gb,gres/gpu:a100_1g_5gb\n") in glob
    assert "GresTypes=gpu,fpga\n" in glob
    gres = [ln for ln in files["gres.conf"].splitlines() if ln.startswith("NodeName=mig1")]
    assert gres[0] == ("NodeName=mig1 Name=gpu Type=a100_3g_20gb MultipleFiles=/dev/nvidia0,"
                       "/dev/nvidia-caps/nvidia-cap3,/dev/nvidia-caps/nvidia-cap4 Cores=0-3")
    # GPU 1's first slice: GPU instance 0 of GPU 1 = minors 3 + 135 and 3 + 135 + 1.
    assert gres[4].endswith("MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap138,"
                            "/dev/nvidia-caps/nvidia-cap139 Cores=0-3")
    assert [ln.split()[2] for ln in gres] == ["Type=a100_3g_20gb", "Type=a100_2g_10gb",
                                              "Type=a100_1g_5gb", "Type=a100_1g_5gb"] * 2
    assert not any(" File=" in ln or "Links=" in ln for ln in gres)


def test_mig_cap_minors_follow_nvidias_numbering() -> None:
    # /proc/driver/nvidia-caps/mig-minors: gpu0/gi0/access 3, gpu0/gi0/ci0/access 4,
    # gpu0/gi2/access 21, gpu1/gi0/access 138.
    assert lv.mig_cap_minors(0, 0) == (3, 4)
    assert lv.mig_cap_minors(0, 2) == (21, 22)
    assert lv.mig_cap_minors(1, 0) == (138, 139)


def test_emulated_capability_files_are_character_devices_to_make() -> None:
    site = parse_site(BASE)
    rt = Runtime(device_dir="/tmp/d", emulate=True)
    caps = [f for f in device_files(site, rt) if f.kind == "mig_cap"]
    assert len(caps) == 2 * 4 * 2
    assert all(f.major == MIG_CAP_MAJOR and f.minor is not None for f in caps)
    assert caps[0].path == "/tmp/d/mig1/nvidia-cap3" and caps[0].mig_slice == 0
    assert len({f.path for f in caps}) == len(caps)
    gres = render(site, whole=True, runtime=rt)["gres.conf"]
    assert "MultipleFiles=/tmp/d/mig1/nvidia0,/tmp/d/mig1/nvidia-cap3,/tmp/d/mig1/nvidia-cap4 " \
        in gres


def test_mig_slices_bill_their_share_of_the_gpu() -> None:
    text = edit('[levers]\nweight_from = "order"\n',
                '[levers]\nweight_from = "order"\nbilling_gpu = 7.0\n'
                '[levers.speed]\nh100 = { t = 2.0 }\na100 = { t = 1.0 }\n')
    bw = lv.billing_weights(parse_site(text))
    assert bw == ("CPU=1,GRES/gpu:h100=14,GRES/gpu:a100=7,GRES/gpu:a100_3g_20gb=3,"
                  "GRES/gpu:a100_2g_10gb=2,GRES/gpu:a100_1g_5gb=1")


@pytest.mark.parametrize(("new", "words"), [
    ('a100 = ["3g.20gb", "3g.20gb", "2g.10gb"]', "8 compute slices"),
    ('a100 = ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.5gb"]', "45 GB"),
    ('a100 = ["3g.40gb"]', "not a MIG profile of the A100-40GB"),
    ('a100 = ["4g.20gb", "4g.20gb"]', "at most 1"),
    ('a10 = ["1g.5gb"]', "did you mean 'a100'"),
])
def test_loader_errors_name_file_key_and_line(new: str, words: str) -> None:
    text = edit(SPLIT, new)
    with pytest.raises(ConfigError) as err:
        parse_site(text, "mig.toml")
    key = "levers.mig." + new.split(" ", 1)[0]
    assert err.value.key == key, str(err.value)
    assert err.value.file == "mig.toml"
    assert err.value.line == line_of(text, new)
    assert words in str(err.value)


def test_shards_and_mig_on_one_model_are_refused() -> None:
    text = BASE + "\n[levers.shards]\na100 = 2\n"
    with pytest.raises(ConfigError, match="both shards and MIG") as err:
        parse_site(text, "mig.toml")
    assert err.value.key == "levers.mig.a100"


def test_a_profile_list_must_be_strings() -> None:
    with pytest.raises(ConfigError) as err:
        parse_site(edit(SPLIT, "a100 = [3]"), "mig.toml")
    assert (err.value.key or "").startswith("levers.mig.a100")


def test_the_80gb_card_follows_the_gpu_memory() -> None:
    text = edit('memory = "40G"', 'memory = "80G"')
    with pytest.raises(ConfigError, match="A100-80GB"):
        parse_site(text)
    site = parse_site(edit(SPLIT, 'a100 = ["3g.40gb", "4g.40gb"]', text))
    assert lv.mig_types(site) == ("a100_3g_40gb", "a100_4g_40gb")

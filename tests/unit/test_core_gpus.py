"""In-node GPU choice: golden cases, then kernel vs reference vs brute force on random nodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetslurm.errors import PlacementError
from hetslurm.placement import (
    MAX_NODE_GPUS,
    MAX_REQUEST,
    NO_FIT,
    choose_gpus,
    choose_gpus_batch,
    pack_score,
    unpack_score,
)
from hetslurm.placement.reference import (
    choose_gpus_bruteforce,
    choose_gpus_reference,
    score_selection,
)

# Under HETSLURM_DEBUG_BUILD=1 an out-of-range index inside a noexcept kernel is reported as an
# "unraisable" exception rather than raised; make that fail the test instead of a warning.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")

core = pytest.importorskip("hetslurm._core", reason="compiled core not built")

PROPERTY = settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def pick(free: list[int], island: list[int], numa: list[int], n: int) -> tuple[int, ...]:
    return choose_gpus(free, island, numa, n).indices


# --- golden cases: (free, island, numa, n, expected indices, expected (islands, leftover, numa))
TWO_ISLANDS = [0, 0, 0, 0, 1, 1, 1, 1]
ONE_NUMA = [0] * 8
TWO_SOCKETS = [0, 0, 0, 0, 1, 1, 1, 1]
PCIE_ONLY = list(range(8))  # no NVLink: every GPU is its own island

# One case per row reads better than the formatter's one value per line.
# fmt: off
GOLDEN: list[tuple[str, list[int], list[int], list[int], int, tuple[int, ...], Any]] = [
    # Slurm 22.05 with Links= only takes 1-4 here and splits both islands.
    (
        "busy GPU 0, 4-GPU request takes the whole free island",
        [0, 1, 1, 1, 1, 1, 1, 1], TWO_ISLANDS, ONE_NUMA, 4, (4, 5, 6, 7), (1, 0, 1),
    ),
    # Leaves the fully free island whole for a later 4-GPU job.
    (
        "2-GPU request, islands with 3 and 4 free: best fit takes the 3-free island",
        [0, 1, 1, 1, 1, 1, 1, 1], TWO_ISLANDS, ONE_NUMA, 2, (1, 2), (1, 1, 1),
    ),
    # Best fit outranks lowest index: the low island is whole, the high one has exactly 2 free.
    (
        "best fit beats lowest index",
        [1, 1, 1, 1, 0, 0, 1, 1], TWO_ISLANDS, ONE_NUMA, 2, (6, 7), (1, 0, 1),
    ),
    (
        "not enough free GPUs: no fit",
        [0, 1, 0, 1, 0, 0, 0, 0], TWO_ISLANDS, ONE_NUMA, 3, (), None,
    ),
    (
        "6 GPUs must span both islands; lowest indices among equal scores",
        [1] * 8, TWO_ISLANDS, ONE_NUMA, 6, (0, 1, 2, 3, 4, 5), (2, 2, 1),
    ),
    # One NVSwitch island across two sockets: stay on one socket when it has room.
    (
        "NUMA breaks the tie inside one island",
        [1, 0, 0, 1, 1, 1, 1, 1], [0] * 8, TWO_SOCKETS, 4, (4, 5, 6, 7), (1, 2, 1),
    ),
    # Islands outrank NUMA: one island over two sockets beats two islands on one socket.
    (
        "fewest islands before fewest NUMA domains",
        [1] * 8, [0, 0, 0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 0, 0, 0], 4, (0, 1, 2, 3), (1, 0, 2),
    ),
    # Free counts 4, 4, 2, 3: two islands are needed; 2 + 3 fits exactly, 4 + 4 strands three.
    (
        "best fit over a pair of islands",
        [1] * 13, [0] * 4 + [1] * 4 + [2] * 2 + [3] * 3, [0] * 13, 5,
        (8, 9, 10, 11, 12), (2, 0, 1),
    ),
    (
        "PCIe-only node, all equal: lowest indices",
        [1] * 8, PCIE_ONLY, ONE_NUMA, 2, (0, 1), (2, 0, 1),
    ),
    # Without NVLink only NUMA distinguishes: 2, 3, 4 would cross the socket boundary.
    (
        "PCIe-only node stays on one socket",
        [0, 0, 1, 1, 1, 1, 1, 1], PCIE_ONLY, TWO_SOCKETS, 3, (4, 5, 6), (3, 0, 1),
    ),
    # Site configs number islands and NUMA domains however they like; only equality matters.
    (
        "sparse, large ids behave like 0..k",
        [0, 1, 1, 1, 1, 1, 1, 1], [70000] * 4 + [7] * 4, [9] * 8, 4, (4, 5, 6, 7), (1, 0, 1),
    ),
    (
        "node with no GPUs: no fit",
        [], [], [], 1, (), None,
    ),
    (
        "request equal to the free count takes all free GPUs",
        [1, 0, 1, 0, 1, 0, 1, 0], TWO_ISLANDS, TWO_SOCKETS, 4, (0, 2, 4, 6), (2, 0, 2),
    ),
]
# fmt: on


@pytest.mark.parametrize(
    ("free", "island", "numa", "n", "indices", "terms"),
    [case[1:] for case in GOLDEN],
    ids=[case[0] for case in GOLDEN],
)
def test_golden(
    free: list[int],
    island: list[int],
    numa: list[int],
    n: int,
    indices: tuple[int, ...],
    terms: tuple[int, int, int] | None,
) -> None:
    choice = choose_gpus(free, island, numa, n)
    assert choice.indices == indices
    if terms is None:
        assert not choice.fits
        assert choice.score == NO_FIT
        assert choice.terms == {}
    else:
        assert choice.fits
        assert choice.terms == dict(zip(("islands", "leftover", "numa"), terms, strict=True))
        assert choice.score == pack_score(*terms)
    assert choose_gpus_reference(free, island, numa, n) == (choice.indices, choice.score)
    assert choose_gpus_bruteforce(free, island, numa, n) == (choice.indices, choice.score)


def test_no_fit_leaves_kernel_output_untouched() -> None:
    out = np.full(3, 77, dtype=np.int32)
    score = core.choose_gpus(
        np.array([1, 0], np.uint8), np.zeros(2, np.int32), np.zeros(2, np.int32), 3, out
    )
    assert score == NO_FIT
    assert out.tolist() == [77, 77, 77]


def test_core_score_layout_matches_reference() -> None:
    assert (core.NO_FIT, core.ISLAND_SHIFT, core.LEFTOVER_SHIFT, core.TERM_BITS) == (
        NO_FIT,
        40,
        20,
        20,
    )
    assert unpack_score(pack_score(3, 5, 2)) == {"islands": 3, "leftover": 5, "numa": 2}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "between 1 and"),
        ({"n": -2}, "between 1 and"),
        ({"n": MAX_REQUEST + 1}, "between 1 and"),
        ({"n": True}, "must be an integer"),
        ({"n": 2.0}, "must be an integer"),
        ({"free": [1, 1, 2, 1]}, "only 0 (busy) and 1 (free)"),
        ({"free": [[1, 1], [1, 1]]}, "one-dimensional"),
        ({"island": [0, 0, 1]}, "island has 3 entries, expected 4"),
        ({"island": [0, -1, 1, 1]}, "island ids must be in"),
        ({"numa": [0, 0, 0, 2**31]}, "numa ids must be in"),
        ({"numa": [0.0, 0.0, 1.0, 1.0]}, "must hold integers"),
    ],
)
def test_bad_request_raises_placement_error(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"free": [1, 1, 1, 1], "island": [0, 0, 1, 1], "numa": [0, 0, 0, 0]}
    args["n"] = 2
    args.update(kwargs)
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(")", r"\)")):
        choose_gpus(**args)


def test_node_size_limit() -> None:
    width = MAX_NODE_GPUS + 1
    with pytest.raises(PlacementError, match="at most"):
        choose_gpus([1] * width, [0] * width, [0] * width, 1)


def test_largest_node_and_request_run() -> None:
    # The widest node allowed: scratch sizing at the limit. 8-GPU islands, 2 islands per NUMA
    # domain; 20 GPUs need 3 islands, hence 2 domains, and leave 4 of the third island.
    width = MAX_NODE_GPUS
    island = [j // 8 for j in range(width)]
    numa = [j // 16 for j in range(width)]
    choice = choose_gpus([1] * width, island, numa, 20)
    assert choice.indices == tuple(range(20))
    assert choice.terms == {"islands": 3, "leftover": 4, "numa": 2}
    assert choose_gpus_reference([1] * width, island, numa, 20) == (choice.indices, choice.score)
    assert not choose_gpus([1] * 4, [0] * 4, [0] * 4, MAX_REQUEST).fits


def test_accepts_bool_and_numpy_inputs() -> None:
    free = np.array([False, True, True, True])
    choice = choose_gpus(free, np.array([5, 5, 6, 6], np.int64), np.zeros(4, np.uint8), np.int64(2))
    assert choice.indices == (2, 3)


# --- batch ---------------------------------------------------------------------------------


def test_batch_golden_two_nodes() -> None:
    # Node 0 is the Links=-only trap; node 1 has only two GPUs free.
    result = choose_gpus_batch(
        [0, 8, 12],
        [0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0],
        [*TWO_ISLANDS, 0, 0, 1, 1],
        [*ONE_NUMA, 0, 0, 0, 0],
        4,
    )
    assert len(result) == 2
    assert result.indices.tolist() == [[4, 5, 6, 7], [-1, -1, -1, -1]]
    assert result.scores.tolist() == [pack_score(1, 0, 1), NO_FIT]
    assert result.node(0).indices == (4, 5, 6, 7)
    assert not result.node(1).fits
    with pytest.raises(ValueError, match="read-only"):
        result.scores[0] = 0


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([], "at least one entry"),
        ([1, 4], "must start at 0"),
        ([0, 3, 2, 4], "never decrease"),
        ([0, 3], "end at 4"),
        ([0.0, 4.0], "must hold integers"),
    ],
)
def test_batch_bad_offsets(offsets: list[Any], message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        choose_gpus_batch(offsets, [1] * 4, [0] * 4, [0] * 4, 1)


def test_batch_no_nodes() -> None:
    result = choose_gpus_batch([0], [], [], [], 2)
    assert len(result) == 0
    assert result.indices.shape == (0, 2)


# --- properties ----------------------------------------------------------------------------


@st.composite
def nodes(draw: st.DrawFn, max_gpus: int = 10) -> tuple[list[int], list[int], list[int], int]:
    """A node with few island/NUMA ids (so ties and crossings are common) and a request."""
    width = draw(st.integers(0, max_gpus))
    free = draw(st.lists(st.sampled_from([0, 1, 1]), min_size=width, max_size=width))
    island = draw(st.lists(st.integers(0, 3), min_size=width, max_size=width))
    numa = draw(st.lists(st.integers(0, 2), min_size=width, max_size=width))
    # Up to one more than the free count: mostly fits, with some no-fit cases.
    n = draw(st.integers(1, sum(free) + 1))
    return free, island, numa, n


@PROPERTY
@given(nodes())
def test_kernel_matches_reference_and_bruteforce(
    node: tuple[list[int], list[int], list[int], int],
) -> None:
    free, island, numa, n = node
    choice = choose_gpus(free, island, numa, n)
    expected = choose_gpus_bruteforce(free, island, numa, n)
    assert (choice.indices, choice.score) == expected
    assert choose_gpus_reference(free, island, numa, n) == expected
    if choice.fits:
        assert len(choice.indices) == n
        assert all(free[j] for j in choice.indices)
        assert list(choice.indices) == sorted(set(choice.indices))
        assert score_selection(free, island, numa, choice.indices) == choice.score
    else:
        assert sum(free) < n


@settings(max_examples=200, deadline=None, derandomize=True)
@given(nodes(max_gpus=24))
def test_kernel_matches_reference_on_wider_nodes(
    node: tuple[list[int], list[int], list[int], int],
) -> None:
    free, island, numa, n = node
    choice = choose_gpus(free, island, numa, n)
    assert (choice.indices, choice.score) == choose_gpus_reference(free, island, numa, n)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(nodes(max_gpus=8), max_size=12), st.integers(1, 6))
def test_batch_matches_single_node_calls(
    batch: list[tuple[list[int], list[int], list[int], int]], n: int
) -> None:
    offsets = [0]
    for free, _, _, _ in batch:
        offsets.append(offsets[-1] + len(free))
    result = choose_gpus_batch(
        offsets,
        [x for node in batch for x in node[0]],
        [x for node in batch for x in node[1]],
        [x for node in batch for x in node[2]],
        n,
    )
    assert len(result) == len(batch)
    for i, (free, island, numa, _) in enumerate(batch):
        assert result.node(i) == choose_gpus(free, island, numa, n)

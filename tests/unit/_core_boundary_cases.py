"""Short and mismatched buffers for every Python entry point of ``hetslurm._core``.

Run by ``test_core_boundary.py`` in a child interpreter, one kernel per child
(``python _core_boundary_cases.py KERNEL``): before the boundary checks some of these calls
wrote past an allocation and aborted the process, which must not take pytest with it. The
child prints one JSON object per case: its name, the outcome expected and the outcome seen
(``"ExceptionType: message"``, or ``"returned ..."``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

Case = tuple[str, str, Callable[[], object]]

KERNELS = ("choose_gpus", "choose_gpus_batch", "PlacementCore", "place", "place_batch",
           "evaluate", "static_fit", "take", "refresh", "NodeSpans", "Releases")


def _i32(*v: int) -> Any:
    return np.array(v, dtype=np.int32)


def _i64(*v: int) -> Any:
    return np.array(v, dtype=np.int64)


def _model() -> Any:
    from hetslurm.placement.model import ClusterModel, GpuLayout, NodeLayout

    gpus = tuple(GpuLayout(island=g // 4, numa=g // 4, memory_mib=40960) for g in range(8))
    return ClusterModel.from_layouts(
        [
            NodeLayout(name="g0", cores_per_numa=(4, 4), mem_mib=65536, gpu_model="a100",
                       gpus=gpus, leaf="s0"),
            NodeLayout(name="f0", cores_per_numa=(4,), mem_mib=65536, fpga_model="u280",
                       fpgas=2, leaf="s0"),
            NodeLayout(name="c0", cores_per_numa=(2, 2), mem_mib=65536, leaf="s1"),
        ],
        switches={"top": None, "s0": "top", "s1": "top"},
    )


def _choose_gpus(core: Any) -> list[Case]:
    free, isl, numa = np.ones(8, np.uint8), _i32(0, 0, 0, 0, 1, 1, 1, 1), _i32(*[0] * 8)
    out = np.zeros(8, np.int32)
    return [
        # The finding: a one-entry out for a 60-GPU choice was written 60 entries deep.
        ("short out", "ValueError: choose_gpus: out has 1 entries, needs at least 60 (n)",
         lambda: core.choose_gpus(np.ones(64, np.uint8), np.zeros(64, np.int32),
                                  np.zeros(64, np.int32), 60, np.zeros(1, np.int32))),
        # The finding: island ids were read for 8 GPUs from a 2-entry array.
        ("short island",
         "ValueError: choose_gpus: island has 2 entries, expected 8 (one per GPU in free)",
         lambda: core.choose_gpus(free, _i32(0, 0), numa, 4, out)),
        ("long numa",
         "ValueError: choose_gpus: numa has 9 entries, expected 8 (one per GPU in free)",
         lambda: core.choose_gpus(free, isl, np.zeros(9, np.int32), 4, out)),
        ("n zero", "ValueError: choose_gpus: n is 0, must be in [1, 65536]",
         lambda: core.choose_gpus(free, isl, numa, 0, out)),
        ("n past the score layout",
         "ValueError: choose_gpus: n is 65537, must be in [1, 65536]",
         lambda: core.choose_gpus(free, isl, numa, 65537, out)),
        ("node wider than the score layout",
         "ValueError: choose_gpus: the node's GPU count is 1048576, must be in [0, 1048575]",
         lambda: core.choose_gpus(np.ones(1 << 20, np.uint8), np.zeros(1 << 20, np.int32),
                                  np.zeros(1 << 20, np.int32), 1, out)),
        ("None free", "TypeError: Argument 'free' must not be None",
         lambda: core.choose_gpus(None, isl, numa, 1, out)),
        ("wrong dtype",
         "ValueError: Buffer dtype mismatch, expected 'const gid_t' but got 'long'",
         lambda: core.choose_gpus(free, isl.astype(np.int64), numa, 1, out)),
        # One island (1 << 40), three of its GPUs left (3 << 20), one NUMA domain.
        ("valid call after the refusals", f"returned {(1 << 40) | (3 << 20) | 1}",
         lambda: core.choose_gpus(free, isl, numa, 1, out)),
    ]


def _choose_gpus_batch(core: Any) -> list[Case]:
    free, isl, numa = np.ones(8, np.uint8), _i32(0, 0, 0, 0, 1, 1, 1, 1), _i32(*[0] * 8)
    offs = _i64(0, 4, 8)
    scores, out = np.zeros(2, np.int64), np.zeros((2, 2), np.int32)

    def call(**kw: Any) -> object:
        a = {"offsets": offs, "free": free, "island": isl, "numa": numa, "n": 2,
             "scores": scores, "out": out} | kw
        return core.choose_gpus_batch(a["offsets"], a["free"], a["island"], a["numa"], a["n"],
                                      a["scores"], a["out"])

    return [
        ("no offsets",
         "ValueError: choose_gpus_batch: offsets has 0 entries, needs at least 1 (nodes + 1)",
         lambda: call(offsets=_i64())),
        ("offsets past the GPUs",
         "ValueError: choose_gpus_batch: offsets must start at 0 and end at 8 (the GPUs in "
         "free), got 0..16",
         lambda: call(offsets=_i64(0, 8, 16), scores=np.zeros(2, np.int64))),
        ("offsets decreasing",
         "ValueError: choose_gpus_batch: offsets decreases at 2: 9 then 8",
         lambda: call(offsets=_i64(0, 9, 8))),
        ("short island",
         "ValueError: choose_gpus_batch: island has 4 entries, expected 8 (one per GPU in "
         "free)",
         lambda: call(island=_i32(0, 0, 1, 1))),
        ("short scores",
         "ValueError: choose_gpus_batch: scores has 1 entries, expected 2 (one per node)",
         lambda: call(scores=np.zeros(1, np.int64))),
        ("short out rows",
         "ValueError: choose_gpus_batch: out rows has 1 entries, expected 2 (one per node)",
         lambda: call(out=np.zeros((1, 2), np.int32))),
        ("narrow out",
         "ValueError: choose_gpus_batch: out columns has 2 entries, needs at least 3 (n)",
         lambda: call(n=3)),
        ("valid call after the refusals", "returned None", lambda: call()),
    ]


def _placement_core(core: Any, model: Any) -> list[Case]:
    base = model.core_arguments()

    def build(**kw: Any) -> object:
        core.PlacementCore(**(base | kw))
        return None

    def place_on_unbuilt() -> object:
        blank = core.PlacementCore.__new__(core.PlacementCore)
        return blank.state()

    return [
        ("short gpu_island",
         "ValueError: PlacementCore: gpu_offsets must start at 0 and end at 4 (the GPUs in "
         "gpu_island), got 0..8",
         lambda: build(gpu_island=_i32(0, 0, 1, 1))),
        ("short gpu_numa",
         "ValueError: PlacementCore: gpu_numa has 4 entries, expected 8 (one per GPU in "
         "gpu_island)",
         lambda: build(gpu_numa=_i32(0, 0, 1, 1))),
        ("short mem_free",
         "ValueError: PlacementCore: mem_free has 2 entries, expected 3 (one per node in "
         "cores_total)",
         lambda: build(mem_free=_i64(1, 1))),
        ("short numa_offsets",
         "ValueError: PlacementCore: numa_offsets has 3 entries, expected 4 (one more than "
         "the nodes)",
         lambda: build(numa_offsets=_i64(0, 2, 3))),
        ("gpu NUMA id past its node's domains",
         "ValueError: PlacementCore: gpu_numa[7] (node 0) is 2, must be in [0, 1]",
         lambda: build(gpu_numa=_i32(0, 0, 0, 0, 1, 1, 1, 2))),
        ("core NUMA id negative",
         "ValueError: PlacementCore: core_numa[0] (node 0) is -1, must be in [0, 1]",
         lambda: build(core_numa=np.concatenate([_i32(-1), model.core_numa[1:]]))),
        ("GPU model id past the models",
         "ValueError: PlacementCore: gpu_model[0] is 1, must be in [-1, 0]",
         lambda: build(gpu_model=_i32(1, -1, -1))),
        ("no cores (the load term divides by it)",
         "ValueError: PlacementCore: cores_total[2] is 0, must be in [1, 2147483648]",
         lambda: build(cores_total=_i32(8, 4, 0))),
        ("leaf switch past the switches",
         "ValueError: PlacementCore: leaf[1] is 3, must be in [0, 2]",
         lambda: build(leaf=_i32(1, 3, 2))),
        ("switch cycle",
         "ValueError: PlacementCore: switch 0 (level 1) has parent 1 of level 0; a parent's "
         "level must be higher",
         lambda: build(switch_parent=_i32(1, 0, 0))),
        ("free flag 2", "ValueError: PlacementCore: gpu_free[3] is 2, must be 0 or 1",
         lambda: build(gpu_free=np.array([1, 1, 1, 2, 1, 1, 1, 1], np.uint8))),
        ("core never built",
         "ValueError: PlacementCore.state: the PlacementCore was never built (its __init__ "
         "failed)",
         place_on_unbuilt),
        ("valid build after the refusals", "returned None", lambda: build()),
    ]


def _request(model: Any, **kw: Any) -> Any:
    from hetslurm.placement.place import _arrays, compile_request
    from hetslurm.request.language import Request

    return _arrays(compile_request(model, Request(**kw)))


def _outputs(size: int = 64) -> list[Any]:
    from hetslurm.placement.model import N_INFO

    return [np.zeros(size, np.int32) for _ in range(4)] + [np.zeros(size, np.int64),
                                                           np.zeros(N_INFO, np.int64)]


def _place(core: Any, model: Any) -> list[Case]:
    pc = model.new_core()
    req, mrank, frank, w = _request(model, nodes=2, gpus_per_node=2, cores_per_node=2)
    outs = _outputs()

    def call(i: int = -1, value: Any = None, **kw: Any) -> object:
        args = [req, mrank, frank, w, False, *outs]
        if i >= 0:
            args[i] = value
        for field, v in kw.items():
            changed = req.copy()
            changed[core.LAYOUT[field]] = v
            args[0] = changed
        return pc.place(*args)

    return [
        ("short nodes_out",
         "ValueError: PlacementCore.place: nodes_out has 1 entries, needs at least 2 "
         "(req[R_NODES])",
         lambda: call(5, np.zeros(1, np.int32))),
        ("short gpus_out",
         "ValueError: PlacementCore.place: gpus_out has 3 entries, needs at least 4 "
         "(req[R_NODES] * req[R_GPUS], at least 1)",
         lambda: call(6, np.zeros(3, np.int32))),
        ("empty fpgas_out",
         "ValueError: PlacementCore.place: fpgas_out has 0 entries, needs at least 1 "
         "(req[R_NODES] * req[R_FPGAS], at least 1)",
         lambda: call(7, np.zeros(0, np.int32))),
        ("short terms_out",
         "ValueError: PlacementCore.place: terms_out has 13 entries, needs at least 14 "
         "(req[R_NODES] * N_T)",
         lambda: call(9, np.zeros(13, np.int64))),
        ("short info",
         "ValueError: PlacementCore.place: info has 7 entries, needs at least 8 (N_INFO)",
         lambda: call(10, np.zeros(7, np.int64))),
        ("short req",
         "ValueError: PlacementCore.place: req has 9 entries, expected 10 (N_REQ)",
         lambda: call(0, req[:9].copy())),
        ("mrank for another model list",
         "ValueError: PlacementCore.place: mrank has 2 entries, expected 1 (one per GPU "
         "model)",
         lambda: call(1, _i32(0, 1))),
        ("frank for another model list",
         "ValueError: PlacementCore.place: frank has 0 entries, expected 1 (one per FPGA "
         "model)",
         lambda: call(2, _i32())),
        ("short w", "ValueError: PlacementCore.place: w has 7 entries, expected 8 (N_W)",
         lambda: call(3, w[:7].copy())),
        ("zero nodes",
         "ValueError: PlacementCore.place: req[R_NODES] is 0, must be in [1, 2147483648]",
         lambda: call(R_NODES=0)),
        ("negative GPUs",
         "ValueError: PlacementCore.place: req[R_GPUS] is -3, must be in [0, 2147483648]",
         lambda: call(R_GPUS=-3)),
        ("huge cores",
         "ValueError: PlacementCore.place: req[R_CORES] is 4611686018427387904, must be in "
         "[0, 2147483648]",
         lambda: call(R_CORES=1 << 62)),
        ("valid call after the refusals", "returned 1", lambda: call()),
    ]


def _place_batch(core: Any, model: Any) -> list[Case]:
    from hetslurm.placement.model import N_INFO

    req, mrank, frank, w = _request(model, gpus_per_node=2, cores_per_node=2)
    reqs, mranks = np.stack([req, req]), np.stack([mrank, mrank])
    franks, ws = np.stack([frank, frank]), np.stack([w, w])
    off = _i64(0, 1, 2)
    outs = [np.zeros(8, np.int32) for _ in range(4)] + [np.zeros(64, np.int64)]

    def call(**kw: Any) -> object:
        a = {"reqs": reqs, "mranks": mranks, "franks": franks, "ws": ws,
             "node_off": off, "gpu_off": _i64(0, 2, 4), "fpga_off": _i64(0, 0, 0),
             "core_off": _i64(0, 2, 4), "nodes_out": outs[0], "gpus_out": outs[1],
             "fpgas_out": outs[2], "cores_out": outs[3], "terms_out": outs[4],
             "status": np.zeros(2, np.int8), "info": np.zeros((2, N_INFO), np.int64)} | kw
        return model.new_core().place_batch(*a.values())

    bad_req = reqs.copy()
    bad_req[1, core.LAYOUT["R_FPGAS"]] = -1
    return [
        ("node offset past nodes_out",
         "ValueError: PlacementCore.place_batch: request 1 writes 1 entries at "
         "node_off[1] = 8, outside nodes_out's 8",
         lambda: call(node_off=_i64(0, 8, 9))),
        ("GPU offset past gpus_out",
         "ValueError: PlacementCore.place_batch: request 1 writes 2 entries at "
         "gpu_off[1] = 7, outside gpus_out's 8",
         lambda: call(gpu_off=_i64(0, 7, 9))),
        ("negative core offset",
         "ValueError: PlacementCore.place_batch: request 0 writes 2 entries at "
         "core_off[0] = -1, outside cores_out's 8",
         lambda: call(core_off=_i64(-1, 2, 4))),
        ("offset near int64 max",
         "ValueError: PlacementCore.place_batch: request 0 writes 1 entries at "
         "node_off[0] = 9223372036854775807, outside nodes_out's 8",
         lambda: call(node_off=_i64((1 << 63) - 1, 1, 2))),
        ("one mrank row for two requests",
         "ValueError: PlacementCore.place_batch: mranks has 1 entries, expected 2 (one row "
         "per request in reqs)",
         lambda: call(mranks=mranks[:1].copy())),
        ("short status",
         "ValueError: PlacementCore.place_batch: status has 1 entries, expected 2 (one row "
         "per request in reqs)",
         lambda: call(status=np.zeros(1, np.int8))),
        ("narrow info",
         "ValueError: PlacementCore.place_batch: info columns has 7 entries, expected 8 "
         "(N_INFO)",
         lambda: call(info=np.zeros((2, N_INFO - 1), np.int64))),
        ("short node_off",
         "ValueError: PlacementCore.place_batch: node_off has 2 entries, expected 3 (one "
         "more than the requests)",
         lambda: call(node_off=_i64(0, 1))),
        ("negative FPGAs in request 1",
         "ValueError: PlacementCore.place_batch request 1: req[R_FPGAS] is -1, must be in "
         "[0, 2147483648]",
         lambda: call(reqs=bad_req)),
        ("valid call after the refusals", "returned None", lambda: call()),
    ]


def _evaluate(core: Any, model: Any) -> list[Case]:
    pc = model.new_core()
    req, mrank, frank, w = _request(model, gpus_per_node=2, cores_per_node=2)
    n = model.n_nodes

    def call(status: Any = None, terms: Any = None, scores: Any = None) -> object:
        return pc.evaluate(req, mrank, frank, w,
                           np.zeros(n, np.int8) if status is None else status,
                           np.zeros(n * 7, np.int64) if terms is None else terms,
                           np.zeros(n, np.int64) if scores is None else scores)

    return [
        ("short status",
         "ValueError: PlacementCore.evaluate: status has 2 entries, needs at least 3 (one "
         "per node)",
         lambda: call(status=np.zeros(2, np.int8))),
        ("short terms",
         "ValueError: PlacementCore.evaluate: terms has 20 entries, needs at least 21 (N_T "
         "per node, at least 1)",
         lambda: call(terms=np.zeros(20, np.int64))),
        ("short scores",
         "ValueError: PlacementCore.evaluate: scores has 0 entries, needs at least 3 (one "
         "per node)",
         lambda: call(scores=np.zeros(0, np.int64))),
        ("short req",
         "ValueError: PlacementCore.evaluate: req has 3 entries, expected 10 (N_REQ)",
         lambda: pc.evaluate(req[:3].copy(), mrank, frank, w, np.zeros(n, np.int8),
                             np.zeros(n * 7, np.int64), np.zeros(n, np.int64))),
        ("valid call after the refusals", "returned None", lambda: call()),
    ]


def _static_fit(core: Any, model: Any) -> list[Case]:
    pc = model.new_core()
    req, mrank, frank, _ = _request(model, gpus_per_node=2, cores_per_node=2)
    n = model.n_nodes
    bad_req = req.copy()
    bad_req[0] = -1

    def call(status: Any = None, r: Any = req, m: Any = mrank) -> object:
        return pc.static_fit(r, m, frank, np.zeros(n, np.int8) if status is None else status)

    return [
        ("short status",
         "ValueError: PlacementCore.static_fit: status has 2 entries, needs at least 3 (one "
         "per node)",
         lambda: call(status=np.zeros(2, np.int8))),
        ("short req",
         "ValueError: PlacementCore.static_fit: req has 3 entries, expected 10 (N_REQ)",
         lambda: call(r=req[:3].copy())),
        ("short mrank",
         f"ValueError: PlacementCore.static_fit: mrank has 0 entries, expected "
         f"{len(mrank)} (one per GPU model)",
         lambda: call(m=mrank[:0].copy())),
        ("negative GPUs",
         "ValueError: PlacementCore.static_fit: req[R_GPUS] is -1, must be in "
         "[0, 2147483648]",
         lambda: call(r=bad_req)),
        ("valid call after the refusals", "returned None", lambda: call()),
    ]


def _take(core: Any, model: Any) -> list[Case]:
    pc = model.new_core()
    none = _i32()

    def call(node: int = 0, gpus: Any = None, fpgas: Any = none, cores: Any = None,
             mem: int = 1024) -> object:
        return pc.take(node, _i32(0, 1) if gpus is None else gpus, fpgas,
                       _i32(0) if cores is None else cores, mem)

    def blank() -> object:
        raw = core.PlacementCore.__new__(core.PlacementCore)
        return raw.take(0, none, none, none, 0)

    def valid() -> object:
        call()
        st = pc.state()
        return (int(st["gpu_free"][:8].sum()), int(st["core_free"][:8].sum()),
                int(st["mem_free"][0]))

    return [
        ("node past the last", "ValueError: PlacementCore.take: node is 3, must be in [0, 2]",
         lambda: call(node=3)),
        ("negative node", "ValueError: PlacementCore.take: node is -1, must be in [0, 2]",
         lambda: call(node=-1)),
        ("GPU past the node's eight",
         "ValueError: PlacementCore.take: gpus[] is 8, must be in [0, 7]",
         lambda: call(gpus=_i32(0, 8))),
        # Node 0 has no FPGA: any FPGA index is outside it.
        ("FPGA on a node without one",
         "ValueError: PlacementCore.take: fpgas[] is 0, must be in [0, -1]",
         lambda: call(fpgas=_i32(0))),
        ("core past the node's eight",
         "ValueError: PlacementCore.take: cores[] is 8, must be in [0, 7]",
         lambda: call(cores=_i32(8))),
        ("negative memory",
         "ValueError: PlacementCore.take: mem is -1, must be in [0, 4611686018427387904]",
         lambda: call(mem=-1)),
        ("core never built",
         "ValueError: PlacementCore.take: the PlacementCore was never built (its __init__ "
         "failed)",
         blank),
        # The refusals took nothing: only this call's two GPUs, one core and 1 GiB are gone.
        ("valid call after the refusals", "returned (6, 7, 64512)", valid),
    ]


def _refresh(core: Any, model: Any) -> list[Case]:
    pc = model.new_core()
    st = model.state
    full = {"available": st.available, "gpu_free": st.gpu_free, "fpga_free": st.fpga_free,
            "core_free": st.core_free, "mem_free": st.mem_free_mib}

    def call(nodes: Any = None, **kw: Any) -> object:
        a = {**full, **kw}
        return pc.refresh(_i64(0) if nodes is None else nodes, a["available"], a["gpu_free"],
                          a["fpga_free"], a["core_free"], a["mem_free"])

    def blank() -> object:
        raw = core.PlacementCore.__new__(core.PlacementCore)
        return raw.refresh(_i64(), *full.values())

    def valid() -> object:
        g = st.gpu_free.copy()
        g[:3] = 0
        c = st.core_free.copy()
        c[:2] = 0
        m = st.mem_free_mib.copy()
        m[0] = 1024
        call(gpu_free=g, core_free=c, mem_free=m)
        s = pc.state()
        return (int(s["gpu_free"][:8].sum()), int(s["core_free"][:8].sum()),
                int(s["mem_free"][0]))

    return [
        ("node past the last", "ValueError: PlacementCore.refresh: nodes[] is 3, must be in "
         "[0, 2]", lambda: call(nodes=_i64(0, 3))),
        ("negative node", "ValueError: PlacementCore.refresh: nodes[] is -1, must be in [0, 2]",
         lambda: call(nodes=_i64(-1))),
        ("short available", "ValueError: PlacementCore.refresh: available has 2 entries, "
         "expected 3 (one per node)", lambda: call(available=np.ones(2, np.uint8))),
        ("short gpu_free", "ValueError: PlacementCore.refresh: gpu_free has 7 entries, "
         "expected 8 (one per GPU)", lambda: call(gpu_free=np.ones(7, np.uint8))),
        ("long fpga_free", "ValueError: PlacementCore.refresh: fpga_free has 3 entries, "
         "expected 2 (one per FPGA)", lambda: call(fpga_free=np.ones(3, np.uint8))),
        ("short core_free", "ValueError: PlacementCore.refresh: core_free has 1 entries, "
         "expected 16 (one per core)", lambda: call(core_free=np.ones(1, np.uint8))),
        ("short mem_free", "ValueError: PlacementCore.refresh: mem_free has 0 entries, "
         "expected 3 (one per node)", lambda: call(mem_free=_i64())),
        ("core never built",
         "ValueError: PlacementCore.refresh: the PlacementCore was never built (its "
         "__init__ failed)", blank),
        # The refusals changed nothing: node 0 now holds what the arrays say.
        ("valid call after the refusals", "returned (5, 6, 1024)", valid),
    ]


def _node_spans(core: Any) -> list[Case]:
    inf = float("inf")
    ns = core.NodeSpans(3)
    ns.add([1], 10.0, 20.0)
    raw, weight = np.array([0.0, 0.0, inf]), _i64(0, 0, 0)

    def valid() -> object:
        when, best, now = ns.earliest_one(raw, 15.0, 0.0, weight, 1)
        return (when, best, now, ns.earliest_multi(raw, 2, 15.0, 0.0, 100.0), ns.count,
                ns.push(_i64(1), np.array([5.0]), 10.0).tolist())

    return [
        ("negative size", "ValueError: NodeSpans: n is -1, must be >= 0",
         lambda: core.NodeSpans(-1)),
        ("add past the last node", "ValueError: NodeSpans.add: node 3 outside 0..2",
         lambda: ns.add([0, 3], 0.0, 1.0)),
        ("add a negative node", "ValueError: NodeSpans.add: node -1 outside 0..2",
         lambda: ns.add([-1], 0.0, 1.0)),
        ("push past the last node", "ValueError: NodeSpans.push: node 7 outside 0..2",
         lambda: ns.push(_i64(7), np.array([0.0]), 1.0)),
        ("push with a short starts",
         "ValueError: NodeSpans.push: starts has 1 entries, expected 2 (one per node)",
         lambda: ns.push(_i64(0, 1), np.array([0.0]), 1.0)),
        ("earliest_one with a short raw",
         "ValueError: NodeSpans.earliest_one: raw has 2 entries, expected 3 (one per node)",
         lambda: ns.earliest_one(np.zeros(2), 1.0, 0.0, weight, 1)),
        ("earliest_one with a short weight",
         "ValueError: NodeSpans.earliest_one: weight has 1 entries, expected 3 (one per node)",
         lambda: ns.earliest_one(raw, 1.0, 0.0, _i64(0), 1)),
        ("earliest_multi with a short raw",
         "ValueError: NodeSpans.earliest_multi: raw has 1 entries, expected 3 (one per node)",
         lambda: ns.earliest_multi(np.zeros(1), 1, 1.0, 0.0, 10.0)),
        ("spans of a node past the last", "ValueError: NodeSpans.spans: node 3 outside 0..2",
         lambda: ns.spans(3)),
        # The refusals added nothing (a refused add checks every node before it adds
        # one): node 0 takes the one-node shape now; node 1, which fits now with spans aside,
        # is kept from it by its span (blocked now) and pushed past it to 20.
        ("valid call after the refusals", "returned (0.0, 0, True, 20.0, 1, [20.0])", valid),
    ]


def _releases(core: Any) -> list[Case]:
    rel = core.Releases(3)
    z = _i64(0, 0, 0)

    def earliest(idx: Any = None, gpu_cnt: Any = z, core_cnt: Any = z, mem_free: Any = z,
                 out: Any = None) -> object:
        o = np.zeros(3) if out is None else out
        rel.earliest(_i64(0, 1) if idx is None else idx, 1, 2, 0, gpu_cnt, core_cnt,
                     mem_free, 5.0, o)
        return o.tolist()

    def valid() -> object:
        rel.add(7, _i64(0, 1), 1, 2, 0, 20.0)
        got = earliest()
        rel.remove(7, _i64(1))
        return (got, earliest(), rel.count)

    return [
        ("negative size", "ValueError: Releases: n is -1, must be >= 0",
         lambda: core.Releases(-1)),
        ("add past the last node", "ValueError: Releases.add: nodes[] is 3, must be in [0, 2]",
         lambda: rel.add(1, _i64(0, 3), 1, 1, 0, 9.0)),
        ("remove a job that holds nothing",
         "ValueError: Releases.remove: job 4 holds nothing on node 0",
         lambda: rel.remove(4, _i64(0))),
        ("remove past the last node",
         "ValueError: Releases.remove: nodes[] is -1, must be in [0, 2]",
         lambda: rel.remove(4, _i64(-1))),
        ("short gpu_cnt", "ValueError: Releases.earliest: gpu_cnt has 2 entries, expected 3 "
         "(one per node)", lambda: earliest(gpu_cnt=_i64(0, 0))),
        ("short core_cnt", "ValueError: Releases.earliest: core_cnt has 1 entries, expected 3 "
         "(one per node)", lambda: earliest(core_cnt=_i64(0))),
        ("long mem_free", "ValueError: Releases.earliest: mem_free has 4 entries, expected 3 "
         "(one per node)", lambda: earliest(mem_free=_i64(0, 0, 0, 0))),
        ("short out", "ValueError: Releases.earliest: out has 2 entries, expected 3 "
         "(one per node)", lambda: earliest(out=np.zeros(2))),
        ("idx past the last node", "ValueError: Releases.earliest: idx[] is 5, must be in "
         "[0, 2]", lambda: earliest(idx=_i64(5))),
        # The refusals added nothing: job 7 alone frees nodes 0 and 1 at 20.
        ("valid call after the refusals",
         "returned ([20.0, 20.0, inf], [20.0, inf, inf], 1)", valid),
    ]


def cases(kernel: str) -> list[Case]:
    """The cases of one kernel (name, expected outcome, call)."""
    import hetslurm._core as core

    if kernel == "choose_gpus":
        return _choose_gpus(core)
    if kernel == "choose_gpus_batch":
        return _choose_gpus_batch(core)
    if kernel == "NodeSpans":
        return _node_spans(core)
    if kernel == "Releases":
        return _releases(core)
    model = _model()
    table = {"PlacementCore": _placement_core, "place": _place, "place_batch": _place_batch,
             "evaluate": _evaluate, "static_fit": _static_fit, "take": _take,
             "refresh": _refresh}
    return table[kernel](core, model)


def outcome(call: Callable[[], object]) -> str:
    """What one call did, as ``"Type: message"`` or ``"returned value"``."""
    try:
        value = call()
    except Exception as e:  # the outcome is the exception, whatever its type
        return f"{type(e).__name__}: {e}"
    return f"returned {value!r}"


def main(kernel: str) -> None:
    for name, expected, call in cases(kernel):
        print(json.dumps({"case": name, "expected": expected, "got": outcome(call)}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

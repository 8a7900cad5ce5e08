# Shared C-level declarations of the placement core.
#
# Behaviour lives in _core.pyx; this file holds only the types, the score layout and the
# GpuChooser interface, so that later Cython modules (node scoring) can `cimport` the
# in-node device choice and call it without the GIL and without Python objects.
# Compiler directives are set in setup.py only.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

# 1 = the GPU is free (schedulable now), 0 = busy, drained or absent.
ctypedef uint8_t flag_t
# GPU indices within a node, NVLink island ids and NUMA ids.
ctypedef int32_t gid_t
# Packed placement score; see SCORE_* below. Lower is better, -1 means "does not fit".
ctypedef int64_t score_t

cdef enum:
    # score = islands << 40 | leftover << 20 | numa. Each lower term is < 2**20 because a node
    # holds at most 2**20 - 1 GPUs (the Python layer enforces far less), and islands <= n <=
    # 2**16, so the packed value stays below 2**57 and compares like the tuple of its terms.
    SCORE_ISLAND_SHIFT = 40
    SCORE_LEFTOVER_SHIFT = 20
    SCORE_TERM_BITS = 20

cdef enum:
    # Decision state of a free GPU during the lowest-index tie-break.
    GPU_OPEN = 0
    GPU_TAKEN = 1
    GPU_SKIPPED = 2


cdef class GpuChooser:
    """Scratch space and kernel for choosing GPUs inside one node (see _core.pyx)."""

    cdef readonly Py_ssize_t capacity
    # Per free GPU j (in index order): its node-local index, compact island, compact NUMA
    # domain and GPU_* decision state.
    cdef gid_t[::1] gpu
    cdef gid_t[::1] gisl
    cdef gid_t[::1] gnuma
    cdef gid_t[::1] state
    # Per compact island: raw id, free count, usable GPUs inside the candidate NUMA set,
    # GPUs already taken by the tie-break.
    cdef gid_t[::1] isl_raw
    cdef gid_t[::1] isl_free
    cdef gid_t[::1] isl_avail
    cdef gid_t[::1] isl_taken
    # Per compact NUMA domain: raw id, free count, usable count, taken count, in-candidate flag.
    cdef gid_t[::1] numa_raw
    cdef gid_t[::1] numa_free
    cdef gid_t[::1] numa_avail
    cdef gid_t[::1] numa_taken
    cdef gid_t[::1] in_d
    # Combination enumeration over NUMA domains, and a sort buffer.
    cdef gid_t[::1] cand
    cdef gid_t[::1] comb
    cdef gid_t[::1] tmp
    # (islands + 1) x (free GPUs + 1) knapsack table, row-major, -1 = unreachable.
    cdef gid_t[::1] dp
    # Sizes of the node being chosen in: free GPUs, islands and NUMA domains with a free GPU.
    cdef Py_ssize_t nf
    cdef Py_ssize_t ni
    cdef Py_ssize_t nq

    cdef score_t choose(
        self,
        const flag_t[::1] free,
        const gid_t[::1] island,
        const gid_t[::1] numa,
        Py_ssize_t n,
        gid_t[::1] out,
    ) noexcept nogil
    cdef bint _skipped_twin(self, Py_ssize_t j) noexcept nogil
    cdef Py_ssize_t _min_cover(self, gid_t[::1] counts, Py_ssize_t length, Py_ssize_t n) noexcept nogil
    cdef void _knapsack(self, bint weighted, Py_ssize_t k, Py_ssize_t tcap) noexcept nogil
    cdef bint _fits_numa_set(self, Py_ssize_t n, Py_ssize_t k, Py_ssize_t total) noexcept nogil
    cdef bint _feasible(
        self, Py_ssize_t n, Py_ssize_t k, Py_ssize_t total, Py_ssize_t m
    ) noexcept nogil


# ------------------------------------------------------------------------------------------
# Node-level placement (PlacementCore). The layouts below are mirrored, by name, as Python
# constants in _core.pyx and checked against hetslurm.placement.model at import time.

cdef enum:
    # Fields of the int64 request vector ``req`` (shape (N_REQ,)).
    R_GPUS = 0          # GPUs per node (0 = none)
    R_FPGAS = 1         # FPGAs per node
    R_CORES = 2         # cores per node, >= 1
    R_MEM = 3           # MiB per node (0 = none asked)
    R_MIN_GPU_MEM = 4   # MiB each chosen GPU must have (0 = any)
    R_NODES = 5         # node count k, >= 1
    R_NVLINK = 6        # 1 = the GPUs of a node must share one NVLink island
    R_NUMA = 7          # 1 = GPUs and cores of a node must share one NUMA domain
    R_SWITCH = 8        # 1 = all k nodes must sit under one leaf switch
    R_CPU_ONLY = 9      # 1 = only nodes without GPUs and FPGAs
    N_REQ = 10

cdef enum:
    # Fields of the int64 weight vector ``w`` (shape (N_W,)); node terms T_* use w[T_*].
    W_SWITCH = 7
    N_W = 8

cdef enum:
    # Per-node score terms (shape (N_T,) per node); all >= 0, lower is better.
    T_MODEL = 0         # rank of the node's GPU model (+ FPGA model) in the request's list
    T_ISLANDS = 1       # NVLink islands spanned by the chosen GPUs, minus one
    T_NUMA = 2          # NUMA domains spanned by the chosen GPUs and cores, minus one
    T_LEFTOVER = 3      # free GPUs + FPGAs left on the node after placing (best fit)
    T_LOAD = 4          # max(per mille of the node's cores in use after placing, measured)
    T_ENERGY = 5        # busy-minus-idle watts of the devices used
    T_WEIGHT = 6        # the node's Slurm Weight
    N_T = 7

cdef enum:
    # Per-node status from evaluation: 0 fits, else the first constraint that fails.
    ST_FITS = 0
    ST_UNAVAILABLE = 1
    ST_CPU_ONLY = 2
    ST_GPU_MODEL = 3
    ST_GPU_COUNT = 4
    ST_GPU_MEM = 5
    ST_GPU_FREE = 6
    ST_NVLINK = 7
    ST_FPGA_MODEL = 8
    ST_FPGA_COUNT = 9
    ST_FPGA_FREE = 10
    ST_CORES = 11
    ST_NUMA = 12
    ST_MEMORY = 13
    N_ST = 14

cdef enum:
    # Result of one placement: 0 placed, else why not.
    PL_PLACED = 0
    PL_FEW_NODES = 1    # fewer than k nodes fit on their own
    PL_SWITCH = 2       # k nodes fit, but no leaf switch holds k of them (switch required)

cdef enum:
    # Fields of the int64 info vector (shape (N_INFO,)) a placement fills.
    I_TOTAL = 0         # total score (valid when placed)
    I_LEVELS = 1        # switch levels spanned (0 = one leaf)
    I_SWITCH = 2        # the switch whose subtree holds the nodes
    I_TOUCHED = 3       # nodes evaluated (single-node requests stop early: see _place)
    I_FITTING = 4       # of those, nodes that fit
    I_BEST_LEAF = 5     # most fitting nodes under one leaf switch
    I_NEXT_NODE = 6     # best fitting node not chosen, -1 if none
    I_NEXT_SCORE = 7    # its node score, -1 if none
    N_INFO = 8


# A fitting node and its score, sorted by (score, node) with qsort.
ctypedef struct cand_t:
    int64_t score
    int32_t node


cdef class PlacementCore:
    """Cluster arrays, live state, the free-capacity index and scratch (see _core.pyx)."""

    # Static layout (read-only numpy arrays owned by hetslurm.placement.model.ClusterModel).
    cdef readonly Py_ssize_t n_nodes
    cdef readonly Py_ssize_t n_gpu_models
    cdef readonly Py_ssize_t n_fpga_models
    cdef readonly Py_ssize_t n_switches
    # Set last by __init__: the Python entry points refuse a core whose arrays were never
    # set or failed their checks (its memoryviews would be uninitialised).
    cdef bint ready
    cdef readonly Py_ssize_t max_gpus
    cdef readonly Py_ssize_t max_numa
    cdef const int32_t[::1] cores_total
    cdef const int64_t[::1] mem_total
    cdef const int32_t[::1] gpu_model
    cdef const int64_t[::1] gpu_offsets
    cdef const int32_t[::1] gpu_island
    cdef const int32_t[::1] gpu_numa
    cdef const int64_t[::1] gpu_mem
    cdef const int32_t[::1] fpga_model
    cdef const int64_t[::1] fpga_offsets
    cdef const int64_t[::1] numa_offsets
    cdef const int64_t[::1] core_offsets
    cdef const int32_t[::1] core_numa
    cdef const int32_t[::1] leaf
    cdef const int32_t[::1] switch_parent
    cdef const int32_t[::1] switch_level
    cdef const int64_t[::1] weight
    cdef const int32_t[::1] gpu_dyn_w
    cdef const int32_t[::1] fpga_dyn_w
    # Measured load per node, per mille (0 = unknown or idle); the load term is the larger of
    # this and the allocated share. Never changed by a commit (a placement is not measured).
    cdef int32_t[::1] load_milli
    # Live state (owned copies; batch placement consumes them).
    cdef uint8_t[::1] available
    cdef uint8_t[::1] gpu_free
    cdef uint8_t[::1] fpga_free
    cdef uint8_t[::1] core_free
    cdef int64_t[::1] mem_free
    cdef int32_t[::1] gpu_free_count
    cdef int32_t[::1] fpga_free_count
    cdef int32_t[::1] numa_free
    # Free-capacity index: one bitset over nodes per bucket (GPU model + 1, free GPUs), so
    # a bucket is walked in ascending node order and a node moves between buckets in O(1).
    cdef Py_ssize_t n_words
    cdef uint64_t[::1] b_bits
    cdef int32_t[::1] b_count
    cdef int32_t[::1] b_key
    # Size of the index's third key (most free GPUs in one NVLink island, 0..largest island):
    # bucket (row, free, most) is at ((row * (max_gpus + 1)) + free) * iwidth + most.
    cdef Py_ssize_t iwidth
    # Per index row (GPU model + 1), for the buckets' score lower bounds: smallest node
    # weight and per-GPU busy-minus-idle watts, largest NVLink island and core count.
    cdef int64_t[::1] row_min_weight
    cdef int64_t[::1] row_min_dyn
    cdef int64_t[::1] row_max_island
    cdef int64_t[::1] row_max_cores
    # ... and the smallest measured load of a row's nodes (the load term is >= it).
    cdef int64_t[::1] row_min_load
    # The same over FPGAs: one bitset per (FPGA model + 1, free FPGAs), for requests that
    # ask FPGAs and no GPUs, with the per-row bounds (smallest weight and per-FPGA watts,
    # largest core count).
    cdef readonly Py_ssize_t max_fpgas
    cdef Py_ssize_t n_fpga_rows
    cdef uint64_t[::1] fb_bits
    cdef int32_t[::1] fb_count
    cdef int32_t[::1] fb_key
    cdef int64_t[::1] frow_min_weight
    cdef int64_t[::1] frow_min_dyn
    cdef int64_t[::1] frow_max_cores
    cdef int64_t[::1] frow_min_load
    # Static bitset of the nodes with no GPU and no FPGA (CPU-only requests walk only these),
    # and per GPU index row the number of such nodes.
    cdef uint64_t[::1] nodev_bits
    cdef int32_t[::1] row_nodev
    cdef int32_t[::1] b_order
    cdef int64_t[::1] b_lb
    # Scratch.
    cdef GpuChooser chooser
    cdef uint8_t[::1] mask
    cdef int32_t[::1] gout
    cdef int32_t[::1] dom_take
    cdef uint8_t[::1] dom_used
    cdef int32_t[::1] dom_seen
    cdef int64_t[::1] tscr
    cdef int32_t[::1] sw_count
    cdef int32_t[::1] sw_taken
    cdef int64_t[::1] sw_sum
    cdef int32_t[::1] sw_touched
    cdef int32_t[::1] cand_anc
    cdef int32_t[::1] chosen
    cdef uint8_t[::1] mark
    cdef cand_t* cands

    cdef int _check_ready(self, str fn) except -1
    cdef int _check_request(
        self, str fn, Py_ssize_t r, const int64_t[::1] req, const int32_t[::1] mrank,
        const int32_t[::1] frank, const int64_t[::1] w,
    ) except -1
    cdef void _index_insert(self, Py_ssize_t i) noexcept nogil
    cdef void _index_remove(self, Py_ssize_t i) noexcept nogil
    cdef int _eval(
        self, Py_ssize_t i, const int64_t[::1] req, const int32_t[::1] mrank,
        const int32_t[::1] frank, int64_t* terms, bint write,
        int32_t* gpus_out, int32_t* fpgas_out, int32_t* cores_out,
    ) noexcept nogil
    cdef int _static(
        self, Py_ssize_t i, const int64_t[::1] req, const int32_t[::1] mrank,
        const int32_t[::1] frank,
    ) noexcept nogil
    cdef bint _set_before(
        self, Py_ssize_t a, Py_ssize_t b, Py_ssize_t n_c, int64_t k
    ) noexcept nogil
    cdef int _place(
        self, const int64_t[::1] req, const int32_t[::1] mrank, const int32_t[::1] frank,
        const int64_t[::1] w, bint commit, int32_t* nodes_out, int32_t* gpus_out,
        int32_t* fpgas_out, int32_t* cores_out, int64_t* terms_out, int64_t* info,
    ) noexcept nogil
    cdef void _commit(
        self, Py_ssize_t i, const int64_t[::1] req, const int32_t* gpus, const int32_t* fpgas,
        const int32_t* cores,
    ) noexcept nogil

# Shared C-level declarations of the placement core.
#
# Behaviour lives in _core.pyx; this file holds only the types, the score layout and the
# GpuChooser interface, so that later Cython modules (node scoring) can `cimport` the
# in-node device choice and call it without the GIL and without Python objects.
# Compiler directives are set in setup.py only.

from libc.stdint cimport int32_t, int64_t, uint8_t

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

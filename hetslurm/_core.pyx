"""Placement kernels: the compiled core of hetslurm.placement.

Pure functions over contiguous arrays. ``hetslurm.placement.gpus`` and
``hetslurm.placement.model`` are the APIs to call: they check values (ranges, 0/1 flags, model
names) and raise ``PlacementError``. The Python entry points here (``choose_gpus``,
``choose_gpus_batch``, ``PlacementCore`` and its methods) are still reachable from Python, so
each one checks, once per call and before it drops the GIL, every length, offset and id its
loops index with, and raises ``ValueError`` naming the argument and both sizes: a short or
mismatched buffer is an error, never a write past an allocation. The checks are O(1) per
placement and O(size) where a core or batch is built; the ``noexcept nogil`` loops behind them
trust what was checked. Compiler directives are set in ``setup.py`` only
(``HETSLURM_DEBUG_BUILD=1`` turns bounds checking on).

The in-node GPU choice
----------------------
Given the free GPUs of one node, each tagged with an NVLink island id and a NUMA id, choose
``n`` of them. Candidates are compared on, in order:

1. ``islands``: NVLink islands spanned by the chosen GPUs (fewer is better);
2. ``leftover``: free GPUs of the spanned islands that stay unchosen, i.e. the free count of
   those islands minus ``n`` (fewer is better: best fit, so a job does not break a whole free
   island when a partly used one fits, and the whole island stays for a bigger job);
3. ``numa``: NUMA domains spanned (fewer is better);
4. the sorted tuple of chosen indices, lexicographically (lowest index wins ties).

The first three are packed into one integer, lower is better::

    score = islands << 40 | leftover << 20 | numa

``-1`` (``NO_FIT``) means fewer than ``n`` GPUs are free. ``hetslurm.placement.reference``
implements the same rule in plain Python and as a brute force over all subsets.

Algorithm: ``islands`` is the fewest largest islands whose free counts reach ``n``. Every
selection spanning that many islands spans exactly the islands it draws from, so ``leftover``
comes from a knapsack over islands (exactly ``islands`` of them, smallest total free count
>= n). ``numa`` is the smallest NUMA set D for which some such island set S holds ``n`` free
GPUs inside D (a knapsack maximising GPUs in D, per candidate D). The lowest-index selection is
then built greedily: take GPU j if an optimal selection still exists with it, else skip it;
a GPU whose island-and-NUMA twin was skipped is skipped too, and once the islands and NUMA
set are pinned the rest is taken in index order. Each check costs up to C(Q, numa) knapsacks
of islands * islands_term * G cells, for G GPUs and Q NUMA domains: about 0.5 us for an 8-GPU
node, exponential only in NUMA domains that cross islands.
"""

import numpy as np

from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t


cdef extern from *:
    # GCC/Clang builtin: index of the lowest set bit (argument must be nonzero).
    int __builtin_ctzll(unsigned long long) nogil
from libc.math cimport INFINITY
from libc.stdlib cimport calloc, free, malloc, qsort, realloc

NO_FIT = -1
ISLAND_SHIFT = SCORE_ISLAND_SHIFT
LEFTOVER_SHIFT = SCORE_LEFTOVER_SHIFT
TERM_BITS = SCORE_TERM_BITS

# Number of per-GPU int32 scratch arrays GpuChooser slices out of one allocation.
cdef Py_ssize_t _N_SCRATCH = 16
# Largest GPU request, and most GPUs in one node, the score layout holds (see _core.pxd).
cdef Py_ssize_t _MAX_REQUEST = 1 << 16
cdef Py_ssize_t _MAX_NODE_GPUS = (1 << SCORE_TERM_BITS) - 1
# Largest per-node count (nodes, GPUs, FPGAs, cores) a request may ask: the products the
# entry points compare with buffer lengths (k * per-node count) then stay within int64.
cdef int64_t _MAX_COUNT = (<int64_t>1) << 31


# --- boundary checks --------------------------------------------------------------------------
# Raised with the GIL, before a kernel runs; each names the entry point, the argument and both
# sizes. They cost a comparison each when they pass.

cdef int _exact(str fn, str name, Py_ssize_t have, Py_ssize_t want, str what) except -1:
    if have != want:
        raise ValueError(f"{fn}: {name} has {have} entries, expected {want} ({what})")
    return 0


cdef int _at_least(str fn, str name, Py_ssize_t have, Py_ssize_t want, str what) except -1:
    if have < want:
        raise ValueError(f"{fn}: {name} has {have} entries, needs at least {want} ({what})")
    return 0


cdef int _in_range(str fn, str name, int64_t value, int64_t low, int64_t high) except -1:
    if value < low or value > high:
        raise ValueError(f"{fn}: {name} is {value}, must be in [{low}, {high}]")
    return 0


cdef int _csr(str fn, str name, const int64_t[::1] off, Py_ssize_t n, Py_ssize_t total,
              str what) except -1:
    """Offsets of n rows over ``total`` entries: shape (n + 1,), 0 first, non-decreasing."""
    cdef Py_ssize_t i
    _exact(fn, name, off.shape[0], n + 1, "one more than the nodes")
    if off[0] != 0 or off[n] != total:
        raise ValueError(
            f"{fn}: {name} must start at 0 and end at {total} ({what}), "
            f"got {off[0]}..{off[n]}"
        )
    for i in range(n):
        if off[i + 1] < off[i]:
            raise ValueError(f"{fn}: {name} decreases at {i + 1}: {off[i]} then {off[i + 1]}")
    return 0


cdef int _flags(str fn, str name, const uint8_t[::1] flags) except -1:
    """0/1 only: free counts summed from them index the free-capacity buckets."""
    cdef Py_ssize_t j
    for j in range(flags.shape[0]):
        if flags[j] > 1:
            raise ValueError(f"{fn}: {name}[{j}] is {flags[j]}, must be 0 or 1")
    return 0


cdef class GpuChooser:
    """Reusable scratch space for choosing GPUs in nodes of up to ``capacity`` GPUs.

    One instance per thread: ``choose`` keeps per-call state in it. Building it takes the GIL
    (it allocates); ``choose`` does not.

    Args:
        capacity: Most GPUs (free or not) a node passed to ``choose`` may have.
    """

    def __cinit__(self, Py_ssize_t capacity):
        cdef Py_ssize_t c = capacity if capacity > 0 else 1
        self.capacity = capacity
        buf = np.zeros(_N_SCRATCH * c + (c + 1) * (c + 1), dtype=np.int32)
        cdef gid_t[::1] b = buf
        self.gpu = b[0 * c:1 * c]
        self.gisl = b[1 * c:2 * c]
        self.gnuma = b[2 * c:3 * c]
        self.state = b[3 * c:4 * c]
        self.isl_raw = b[4 * c:5 * c]
        self.isl_free = b[5 * c:6 * c]
        self.isl_avail = b[6 * c:7 * c]
        self.isl_taken = b[7 * c:8 * c]
        self.numa_raw = b[8 * c:9 * c]
        self.numa_free = b[9 * c:10 * c]
        self.numa_avail = b[10 * c:11 * c]
        self.numa_taken = b[11 * c:12 * c]
        self.in_d = b[12 * c:13 * c]
        self.cand = b[13 * c:14 * c]
        self.comb = b[14 * c:15 * c]
        self.tmp = b[15 * c:16 * c]
        self.dp = b[_N_SCRATCH * c:]

    cdef score_t choose(
        self,
        const flag_t[::1] free,
        const gid_t[::1] island,
        const gid_t[::1] numa,
        Py_ssize_t n,
        gid_t[::1] out,
    ) noexcept nogil:
        """Choose ``n`` GPUs of one node; see the module docstring for the policy.

        Args:
            free: shape (G,), uint8; nonzero = free. G <= capacity.
            island: shape (G,), int32 >= 0; NVLink island id of each GPU.
            numa: shape (G,), int32 >= 0; NUMA domain id of each GPU.
            n: GPUs wanted, > 0.
            out: shape (>= n,), int32; receives the chosen node-local indices, ascending.
                Untouched when the result is NO_FIT.

        Returns:
            The packed score, or -1 when fewer than ``n`` GPUs are free.
        """
        cdef Py_ssize_t g = free.shape[0]
        cdef Py_ssize_t j, j2, s, q, k, total, m, taken, pinned_isl, pinned_numa
        cdef bint take
        cdef Py_ssize_t nf = 0, ni = 0, nq = 0
        if n <= 0:
            return -1
        # Compact raw ids to 0..ni-1 / 0..nq-1 over free GPUs only: busy GPUs never matter,
        # and raw ids may be sparse (site configs number islands per rack, not per node).
        for j in range(g):
            if free[j] == 0:
                continue
            s = 0
            while s < ni and self.isl_raw[s] != island[j]:
                s += 1
            if s == ni:
                self.isl_raw[s] = island[j]
                self.isl_free[s] = 0
                self.isl_taken[s] = 0
                ni += 1
            self.isl_free[s] += 1
            q = 0
            while q < nq and self.numa_raw[q] != numa[j]:
                q += 1
            if q == nq:
                self.numa_raw[q] = numa[j]
                self.numa_free[q] = 0
                self.numa_taken[q] = 0
                nq += 1
            self.numa_free[q] += 1
            self.gpu[nf] = <gid_t>j
            self.gisl[nf] = <gid_t>s
            self.gnuma[nf] = <gid_t>q
            self.state[nf] = GPU_OPEN
            nf += 1
        self.nf = nf
        self.ni = ni
        self.nq = nq
        if self.nf < n:
            return -1

        k = self._min_cover(self.isl_free, self.ni, n)
        # Reachable free-count totals of exactly k islands; the smallest >= n is the best fit.
        self._knapsack(False, k, self.nf)
        total = n
        while self.dp[k * (self.nf + 1) + total] < 0:
            total += 1
        # No NUMA set smaller than the greedy cover can hold n GPUs, so start the search there.
        m = self._min_cover(self.numa_free, self.nq, n)
        while not self._feasible(n, k, total, m):
            m += 1

        # Lowest-index tie-break: each step keeps "an optimal selection extends the GPUs taken,
        # avoiding the ones skipped" true, so the final set is optimal and lexicographically first.
        taken = 0
        pinned_isl = 0
        pinned_numa = 0
        for j in range(self.nf):
            if taken == n:
                break
            s = self.gisl[j]
            q = self.gnuma[j]
            if self.nf - j == n - taken:
                # Every remaining GPU is needed; the invariant says that is optimal.
                for j2 in range(j, self.nf):
                    self.state[j2] = GPU_TAKEN
                taken = n
                break
            if pinned_isl == k and pinned_numa == m:
                # Islands and NUMA set are fixed: any n usable GPUs inside both are optimal.
                take = self.isl_taken[s] > 0 and self.numa_taken[q] > 0
            elif self._skipped_twin(j):
                # GPUs sharing island and NUMA domain are interchangeable, and constraints only
                # grow, so a twin's earlier refusal still holds.
                take = False
            else:
                self.isl_taken[s] += 1
                self.numa_taken[q] += 1
                take = self._feasible(n, k, total, m)
                self.isl_taken[s] -= 1
                self.numa_taken[q] -= 1
            if take:
                self.state[j] = GPU_TAKEN
                pinned_isl += self.isl_taken[s] == 0
                pinned_numa += self.numa_taken[q] == 0
                self.isl_taken[s] += 1
                self.numa_taken[q] += 1
                taken += 1
            else:
                self.state[j] = GPU_SKIPPED

        taken = 0
        for j in range(self.nf):
            if self.state[j] == GPU_TAKEN:
                out[taken] = self.gpu[j]
                taken += 1
        return (
            (<score_t>k << SCORE_ISLAND_SHIFT)
            | (<score_t>(total - n) << SCORE_LEFTOVER_SHIFT)
            | <score_t>m
        )

    cdef bint _skipped_twin(self, Py_ssize_t j) noexcept nogil:
        """Whether a free GPU before j in the same island and NUMA domain was skipped."""
        cdef Py_ssize_t i
        for i in range(j):
            if (
                self.state[i] == GPU_SKIPPED
                and self.gisl[i] == self.gisl[j]
                and self.gnuma[i] == self.gnuma[j]
            ):
                return True
        return False

    cdef Py_ssize_t _min_cover(
        self, gid_t[::1] counts, Py_ssize_t length, Py_ssize_t n
    ) noexcept nogil:
        """Fewest of ``counts[:length]`` (int32 >= 1) whose sum reaches ``n``; needs sum >= n."""
        cdef Py_ssize_t i, p, covered = 0
        cdef gid_t v
        # Insertion sort, descending: length is the island/NUMA count of one node (small).
        for i in range(length):
            v = counts[i]
            p = i
            while p > 0 and self.tmp[p - 1] < v:
                self.tmp[p] = self.tmp[p - 1]
                p -= 1
            self.tmp[p] = v
        for i in range(length):
            covered += self.tmp[i]
            if covered >= n:
                return i + 1
        return length

    cdef void _knapsack(self, bint weighted, Py_ssize_t k, Py_ssize_t tcap) noexcept nogil:
        """Fill dp[c * (tcap + 1) + t] for c <= k, t <= tcap over the ni islands.

        The entry is the largest total ``isl_avail`` (0 when not ``weighted``) over sets of
        exactly c islands whose free counts sum to t and that contain every island with a taken
        GPU; -1 when no such set exists.
        """
        cdef Py_ssize_t row = tcap + 1
        cdef Py_ssize_t s, c, t, f, i
        cdef gid_t wt, prev, take
        cdef bint forced
        for i in range((k + 1) * row):
            self.dp[i] = -1
        self.dp[0] = 0
        for s in range(self.ni):
            f = self.isl_free[s]
            wt = self.isl_avail[s] if weighted else 0
            forced = self.isl_taken[s] > 0
            # Rows descend so row c - 1 still holds the table without island s (0/1 knapsack).
            c = k
            while c >= 1:
                t = tcap
                while t >= 0:
                    take = -1
                    if t >= f:
                        prev = self.dp[(c - 1) * row + t - f]
                        if prev >= 0:
                            take = prev + wt
                    if forced or take > self.dp[c * row + t]:
                        self.dp[c * row + t] = take
                    t -= 1
                c -= 1
            if forced:
                for t in range(row):
                    self.dp[t] = -1

    cdef bint _fits_numa_set(self, Py_ssize_t n, Py_ssize_t k, Py_ssize_t total) noexcept nogil:
        """Whether k islands of free total ``total`` hold n usable GPUs inside ``in_d``."""
        cdef Py_ssize_t j, s, usable = 0
        for s in range(self.ni):
            self.isl_avail[s] = 0
        for j in range(self.nf):
            if self.state[j] != GPU_SKIPPED and self.in_d[self.gnuma[j]]:
                self.isl_avail[self.gisl[j]] += 1
                usable += 1
        if usable < n:
            return False
        self._knapsack(True, k, total)
        return self.dp[k * (total + 1) + total] >= n

    cdef bint _feasible(
        self, Py_ssize_t n, Py_ssize_t k, Py_ssize_t total, Py_ssize_t m
    ) noexcept nogil:
        """Whether a selection with terms (k, total - n, m) extends the taken GPUs.

        Enumerates NUMA sets D of size m holding every domain with a taken GPU. A D whose
        domain has no usable GPU is skipped: a selection inside it would span fewer than m
        domains, which cannot happen once m is the optimum.
        """
        cdef Py_ssize_t j, q, s, i, i2, r, ncand = 0, nforced = 0, nisl = 0
        cdef bint ok
        for s in range(self.ni):
            if self.isl_taken[s] > 0:
                nisl += 1
        if nisl > k:
            return False
        for q in range(self.nq):
            self.in_d[q] = 0
            self.numa_avail[q] = 0
        for j in range(self.nf):
            if self.state[j] != GPU_SKIPPED:
                self.numa_avail[self.gnuma[j]] += 1
        for q in range(self.nq):
            if self.numa_taken[q] > 0:
                self.in_d[q] = 1
                nforced += 1
            elif self.numa_avail[q] > 0:
                self.cand[ncand] = <gid_t>q
                ncand += 1
        r = m - nforced
        if r < 0 or r > ncand:
            return False
        for i in range(r):
            self.comb[i] = <gid_t>i
        while True:
            for i in range(r):
                self.in_d[self.cand[self.comb[i]]] = 1
            ok = self._fits_numa_set(n, k, total)
            for i in range(r):
                self.in_d[self.cand[self.comb[i]]] = 0
            if ok:
                return True
            # Next r-combination of 0..ncand-1 in lexicographic order.
            i = r - 1
            while i >= 0 and self.comb[i] == ncand - r + i:
                i -= 1
            if i < 0:
                return False
            self.comb[i] += 1
            for i2 in range(i + 1, r):
                self.comb[i2] = self.comb[i2 - 1] + 1


def choose_gpus(
    const flag_t[::1] free not None,
    const gid_t[::1] island not None,
    const gid_t[::1] numa not None,
    Py_ssize_t n,
    gid_t[::1] out not None,
):
    """Choose ``n`` GPUs in one node (policy and score in the module docstring).

    Checks lengths only (``ValueError``); call ``hetslurm.placement.gpus.choose_gpus``, which
    also checks values and accepts lists.

    Args:
        free: shape (G,), uint8, C-contiguous; 1 = free, 0 = busy.
        island: shape (G,), int32 >= 0, C-contiguous; NVLink island id per GPU.
        numa: shape (G,), int32 >= 0, C-contiguous; NUMA domain id per GPU.
        n: GPUs wanted, 1 <= n <= 2**16.
        out: shape (>= n,), int32, C-contiguous, writable; receives the chosen node-local
            indices in ascending order. Untouched when the result is -1.

    Returns:
        int: the packed score (lower is better), or -1 when fewer than ``n`` GPUs are free.

    Raises:
        ValueError: ``n`` out of range, ``island``/``numa`` not as long as ``free``, ``out``
            shorter than ``n``, or more GPUs than the score layout holds.
    """
    _check_node("choose_gpus", free.shape[0], island.shape[0], numa.shape[0], n)
    _in_range("choose_gpus", "the node's GPU count", free.shape[0], 0, _MAX_NODE_GPUS)
    _at_least("choose_gpus", "out", out.shape[0], n, "n")
    cdef GpuChooser chooser = GpuChooser(free.shape[0])
    cdef score_t score
    with nogil:
        score = chooser.choose(free, island, numa, n, out)
    return score


cdef int _check_node(str fn, Py_ssize_t g, Py_ssize_t n_island, Py_ssize_t n_numa,
                     Py_ssize_t n) except -1:
    """The per-GPU arrays of ``g`` GPUs agree, and ``n`` fits the score layout."""
    _exact(fn, "island", n_island, g, "one per GPU in free")
    _exact(fn, "numa", n_numa, g, "one per GPU in free")
    _in_range(fn, "n", n, 1, _MAX_REQUEST)
    return 0


def choose_gpus_batch(
    const int64_t[::1] offsets not None,
    const flag_t[::1] free not None,
    const gid_t[::1] island not None,
    const gid_t[::1] numa not None,
    Py_ssize_t n,
    score_t[::1] scores not None,
    gid_t[:, ::1] out not None,
):
    """Choose ``n`` GPUs in each of N nodes laid out in CSR form, without the GIL.

    Node i owns the GPUs ``offsets[i]:offsets[i + 1]`` of the flat arrays; indices written to
    ``out`` are node-local (0 = the node's first GPU), as Slurm and CUDA number them.
    Trusts its inputs; call ``hetslurm.placement.gpus.choose_gpus_batch`` instead.

    Args:
        offsets: shape (N + 1,), int64, non-decreasing, offsets[0] == 0, offsets[N] == G.
        free: shape (G,), uint8; 1 = free.
        island: shape (G,), int32 >= 0; NVLink island id per GPU.
        numa: shape (G,), int32 >= 0; NUMA domain id per GPU.
        n: GPUs wanted on each node, 1 <= n <= 2**16.
        scores: shape (N,), int64, writable; receives each node's packed score or -1.
        out: shape (N, n), int32, C-contiguous, writable; row i receives node i's chosen
            indices, ascending. Rows of nodes scoring -1 are left untouched.

    Raises:
        ValueError: offsets empty, not starting at 0, decreasing or not ending at G; the
            per-GPU arrays of different lengths; ``scores`` or ``out`` not one row per node;
            ``out`` narrower than ``n``; a node wider than the score layout holds.
    """
    cdef str fn = "choose_gpus_batch"
    _at_least(fn, "offsets", offsets.shape[0], 1, "nodes + 1")
    cdef Py_ssize_t i, a, b, nodes = offsets.shape[0] - 1, widest = 0
    _check_node(fn, free.shape[0], island.shape[0], numa.shape[0], n)
    _csr(fn, "offsets", offsets, nodes, free.shape[0], "the GPUs in free")
    _exact(fn, "scores", scores.shape[0], nodes, "one per node")
    _exact(fn, "out rows", out.shape[0], nodes, "one per node")
    _at_least(fn, "out columns", out.shape[1], n, "n")
    for i in range(nodes):
        if offsets[i + 1] - offsets[i] > widest:
            widest = offsets[i + 1] - offsets[i]
    _in_range(fn, "the widest node's GPU count", widest, 0, _MAX_NODE_GPUS)
    cdef GpuChooser chooser = GpuChooser(widest)
    with nogil:
        for i in range(nodes):
            a = offsets[i]
            b = offsets[i + 1]
            scores[i] = chooser.choose(free[a:b], island[a:b], numa[a:b], n, out[i, :])


# ==========================================================================================
# Node-level placement
# ==========================================================================================
#
# Which nodes, and which devices and cores on each. The policy is defined in
# ``hetslurm.placement.reference`` (plain Python, the executable specification) and in
# ``docs/placement.md``; this is the fast implementation. In short, for one request of k nodes
# with the same per-node needs:
#
# 1. every candidate node is *evaluated*: feasibility (available, model allowed, enough free
#    mem-qualified GPUs, FPGAs, cores, memory; NVLink/NUMA when required), the GPUs chosen by
#    GpuChooser, FPGAs by lowest free index, cores from the chosen GPUs' NUMA domains first;
#    it yields N_T integer terms and the node score sum(w[t] * terms[t]);
# 2. the fitting nodes are sorted by (score, node index); the node set spans the fewest switch
#    levels (lowest level L of a switch holding k fitting nodes), and among the switches of
#    level L the one whose k best nodes have the lowest score sum wins; equal sums go to the
#    set with the lexicographically smallest sorted node tuple;
# 3. total = sum of the chosen nodes' scores + w[W_SWITCH] * L.
#
# Candidates come from free-capacity indexes (bitsets by GPU model, free GPU count and most free
# GPUs in one NVLink island; by FPGA model and free FPGA count), so a GPU request touches only
# nodes of an allowed model with enough free GPUs, an FPGA-only request only nodes of an
# allowed FPGA model with enough free FPGAs, and a CPU-only request only nodes without devices;
# other GPU-less requests walk every available node (a CPU job may use a device node's cores).

LAYOUT = {
    "R_GPUS": R_GPUS, "R_FPGAS": R_FPGAS, "R_CORES": R_CORES, "R_MEM": R_MEM,
    "R_MIN_GPU_MEM": R_MIN_GPU_MEM, "R_NODES": R_NODES, "R_NVLINK": R_NVLINK,
    "R_NUMA": R_NUMA, "R_SWITCH": R_SWITCH, "R_CPU_ONLY": R_CPU_ONLY, "N_REQ": N_REQ,
    "W_SWITCH": W_SWITCH, "N_W": N_W,
    "T_MODEL": T_MODEL, "T_ISLANDS": T_ISLANDS, "T_NUMA": T_NUMA, "T_LEFTOVER": T_LEFTOVER,
    "T_LOAD": T_LOAD, "T_ENERGY": T_ENERGY, "T_WEIGHT": T_WEIGHT, "N_T": N_T,
    "ST_FITS": ST_FITS, "ST_UNAVAILABLE": ST_UNAVAILABLE, "ST_CPU_ONLY": ST_CPU_ONLY,
    "ST_GPU_MODEL": ST_GPU_MODEL, "ST_GPU_COUNT": ST_GPU_COUNT, "ST_GPU_MEM": ST_GPU_MEM,
    "ST_GPU_FREE": ST_GPU_FREE, "ST_NVLINK": ST_NVLINK, "ST_FPGA_MODEL": ST_FPGA_MODEL,
    "ST_FPGA_COUNT": ST_FPGA_COUNT, "ST_FPGA_FREE": ST_FPGA_FREE, "ST_CORES": ST_CORES,
    "ST_NUMA": ST_NUMA, "ST_MEMORY": ST_MEMORY, "N_ST": N_ST,
    "PL_PLACED": PL_PLACED, "PL_FEW_NODES": PL_FEW_NODES, "PL_SWITCH": PL_SWITCH,
    "I_TOTAL": I_TOTAL, "I_LEVELS": I_LEVELS, "I_SWITCH": I_SWITCH, "I_TOUCHED": I_TOUCHED,
    "I_FITTING": I_FITTING, "I_BEST_LEAF": I_BEST_LEAF, "I_NEXT_NODE": I_NEXT_NODE,
    "I_NEXT_SCORE": I_NEXT_SCORE, "N_INFO": N_INFO,
}


cdef int _cmp_cand(const void* a, const void* b) noexcept nogil:
    cdef const cand_t* x = <const cand_t*>a
    cdef const cand_t* y = <const cand_t*>b
    if x.score != y.score:
        return -1 if x.score < y.score else 1
    return (x.node > y.node) - (x.node < y.node)


cdef int _cmp_i32(const void* a, const void* b) noexcept nogil:
    cdef int32_t x = (<const int32_t*>a)[0]
    cdef int32_t y = (<const int32_t*>b)[0]
    return (x > y) - (x < y)


cdef inline int64_t _max64(int64_t a, int64_t b) noexcept nogil:
    return a if a > b else b


cdef inline int64_t _weigh(const int64_t* terms, const int64_t[::1] w) noexcept nogil:
    cdef int64_t s = 0
    cdef Py_ssize_t t
    for t in range(N_T):
        s += terms[t] * w[t]
    return s


cdef int _out_span(str fn, Py_ssize_t r, str off_name, str out_name, int64_t start,
                   int64_t count, Py_ssize_t length) except -1:
    """Request r of a batch writes out[start:start + count]: inside the buffer."""
    # count >= 0 and start <= length are known before start + count is formed (no overflow).
    if start < 0 or start > length or count > length - start:
        raise ValueError(
            f"{fn}: request {r} writes {count} entries at {off_name}[{r}] = {start}, "
            f"outside {out_name}'s {length}"
        )
    return 0


cdef int _check_cluster(
    Py_ssize_t n,
    const int32_t[::1] cores_total,
    const int64_t[::1] mem_total,
    const int32_t[::1] gpu_model,
    const int64_t[::1] gpu_offsets,
    const int32_t[::1] gpu_island,
    const int32_t[::1] gpu_numa,
    const int64_t[::1] gpu_mem,
    const int32_t[::1] fpga_model,
    const int64_t[::1] fpga_offsets,
    const int64_t[::1] numa_offsets,
    const int64_t[::1] core_offsets,
    const int32_t[::1] core_numa,
    const int32_t[::1] leaf,
    const int32_t[::1] switch_parent,
    const int32_t[::1] switch_level,
    const int64_t[::1] weight,
    const int32_t[::1] gpu_dyn_w,
    const int32_t[::1] fpga_dyn_w,
    Py_ssize_t n_gpu_models,
    Py_ssize_t n_fpga_models,
    const uint8_t[::1] available,
    const uint8_t[::1] gpu_free,
    const uint8_t[::1] fpga_free,
    const uint8_t[::1] core_free,
    const int64_t[::1] mem_free,
) except -1:
    """What PlacementCore's loops index with: every length, CSR offset and id.

    Values that only enter scores (memory, weights, watts, island ids) are the model's to
    check; what is checked here is what would otherwise read or write outside an array,
    divide by zero or loop for ever (a switch cycle).
    """
    cdef str fn = "PlacementCore"
    cdef Py_ssize_t i, j, s, nd, g, f, c, n_sw = switch_parent.shape[0]
    cdef int32_t p
    _in_range(fn, "n_gpu_models", n_gpu_models, 0, _MAX_COUNT)
    _in_range(fn, "n_fpga_models", n_fpga_models, 0, _MAX_COUNT)
    for name, have in (
        ("mem_total", mem_total.shape[0]), ("gpu_model", gpu_model.shape[0]),
        ("fpga_model", fpga_model.shape[0]), ("leaf", leaf.shape[0]),
        ("weight", weight.shape[0]), ("gpu_dyn_w", gpu_dyn_w.shape[0]),
        ("fpga_dyn_w", fpga_dyn_w.shape[0]), ("available", available.shape[0]),
        ("mem_free", mem_free.shape[0]),
    ):
        _exact(fn, name, have, n, "one per node in cores_total")
    _csr(fn, "gpu_offsets", gpu_offsets, n, gpu_island.shape[0], "the GPUs in gpu_island")
    g = gpu_island.shape[0]
    for name, have in (
        ("gpu_numa", gpu_numa.shape[0]), ("gpu_mem", gpu_mem.shape[0]),
        ("gpu_free", gpu_free.shape[0]),
    ):
        _exact(fn, name, have, g, "one per GPU in gpu_island")
    f = fpga_free.shape[0]
    _csr(fn, "fpga_offsets", fpga_offsets, n, f, "the FPGAs in fpga_free")
    c = core_numa.shape[0]
    _csr(fn, "core_offsets", core_offsets, n, c, "the cores in core_numa")
    _exact(fn, "core_free", core_free.shape[0], c, "one per core in core_numa")
    if numa_offsets.shape[0] >= 1:
        nd = numa_offsets[numa_offsets.shape[0] - 1]
    else:
        nd = 0
    _csr(fn, "numa_offsets", numa_offsets, n, nd, "the NUMA domains")
    _exact(fn, "switch_level", switch_level.shape[0], n_sw, "one per switch in switch_parent")
    for name, flags in (
        ("available", available), ("gpu_free", gpu_free), ("fpga_free", fpga_free),
        ("core_free", core_free),
    ):
        _flags(fn, name, flags)
    # Per node and per device: plain comparisons first, the message built only on failure.
    for i in range(n):
        if not (
            cores_total[i] >= 1
            and -1 <= gpu_model[i] < n_gpu_models
            and -1 <= fpga_model[i] < n_fpga_models
            and 0 <= leaf[i] < n_sw
            and gpu_offsets[i + 1] - gpu_offsets[i] <= _MAX_NODE_GPUS
        ):
            _in_range(fn, f"cores_total[{i}]", cores_total[i], 1, _MAX_COUNT)
            _in_range(fn, f"gpu_model[{i}]", gpu_model[i], -1, n_gpu_models - 1)
            _in_range(fn, f"fpga_model[{i}]", fpga_model[i], -1, n_fpga_models - 1)
            _in_range(fn, f"leaf[{i}]", leaf[i], 0, n_sw - 1)
            _in_range(fn, f"the GPU count of node {i}", gpu_offsets[i + 1] - gpu_offsets[i],
                      0, _MAX_NODE_GPUS)
        nd = numa_offsets[i + 1] - numa_offsets[i]
        for j in range(gpu_offsets[i], gpu_offsets[i + 1]):
            if gpu_numa[j] < 0 or gpu_numa[j] >= nd:
                _in_range(fn, f"gpu_numa[{j}] (node {i})", gpu_numa[j], 0, nd - 1)
        for j in range(core_offsets[i], core_offsets[i + 1]):
            if core_numa[j] < 0 or core_numa[j] >= nd:
                _in_range(fn, f"core_numa[{j}] (node {i})", core_numa[j], 0, nd - 1)
    for s in range(n_sw):
        p = switch_parent[s]
        if switch_level[s] < 0 or p < -1 or p >= n_sw:
            _in_range(fn, f"switch_level[{s}]", switch_level[s], 0, _MAX_COUNT)
            _in_range(fn, f"switch_parent[{s}]", p, -1, n_sw - 1)
        # Levels rising strictly towards the root make every walk up the tree end.
        if p >= 0 and switch_level[p] <= switch_level[s]:
            raise ValueError(
                f"{fn}: switch {s} (level {switch_level[s]}) has parent {p} of level "
                f"{switch_level[p]}; a parent's level must be higher"
            )
    return 0


cdef class PlacementCore:
    """The cluster as arrays, its live state, the free-capacity index and scratch space.

    Built by ``hetslurm.placement.model.ClusterModel.core()``, which validates every array
    once; the kernels trust them. The static arrays are shared (read-only); the state arrays
    are copied, so a core may be consumed by batch placement without touching its model.
    Not thread-safe: one core per thread.

    Static arrays (N nodes, G GPUs, F FPGAs, D NUMA domains, C cores, S switches, all
    C-contiguous):

    * cores_total (N,) int32 >= 1; mem_total (N,) int64 MiB; weight (N,) int64 >= 0;
    * gpu_model (N,) int32, model id or -1; gpu_offsets (N+1,) int64 CSR into the per-GPU
      arrays gpu_island (G,) int32, gpu_numa (G,) int32 (node-local domain), gpu_mem (G,)
      int64 MiB (0 = unknown);
    * fpga_model (N,) int32 or -1; fpga_offsets (N+1,) int64 CSR over F FPGAs;
    * numa_offsets (N+1,) int64 CSR over D domains; core_offsets (N+1,) int64 CSR over C
      cores; core_numa (C,) int32 node-local domain of each core;
    * leaf (N,) int32 switch id; switch_parent (S,) int32 (-1 = root); switch_level (S,)
      int32 (0 = leaf, parent > child);
    * gpu_dyn_w, fpga_dyn_w (N,) int32: busy-minus-idle watts of one device of the node.

    State arrays (copied): available (N,) uint8; gpu_free (G,), fpga_free (F,), core_free
    (C,) uint8 (1 = free); mem_free (N,) int64 MiB; load_milli (N,) int32 in 0..1000, the
    measured load per mille (None: 0 everywhere, nothing measured). The load term is the
    larger of the share of cores allocated after placing and the measured load.
    """

    def __cinit__(self, *args, **kwargs):
        self.cands = NULL

    def __dealloc__(self):
        if self.cands != NULL:
            free(self.cands)
            self.cands = NULL

    def __init__(
        self,
        *,
        const int32_t[::1] cores_total not None,
        const int64_t[::1] mem_total not None,
        const int32_t[::1] gpu_model not None,
        const int64_t[::1] gpu_offsets not None,
        const int32_t[::1] gpu_island not None,
        const int32_t[::1] gpu_numa not None,
        const int64_t[::1] gpu_mem not None,
        const int32_t[::1] fpga_model not None,
        const int64_t[::1] fpga_offsets not None,
        const int64_t[::1] numa_offsets not None,
        const int64_t[::1] core_offsets not None,
        const int32_t[::1] core_numa not None,
        const int32_t[::1] leaf not None,
        const int32_t[::1] switch_parent not None,
        const int32_t[::1] switch_level not None,
        const int64_t[::1] weight not None,
        const int32_t[::1] gpu_dyn_w not None,
        const int32_t[::1] fpga_dyn_w not None,
        Py_ssize_t n_gpu_models,
        Py_ssize_t n_fpga_models,
        available,
        gpu_free,
        fpga_free,
        core_free,
        mem_free,
        load_milli=None,
    ):
        cdef Py_ssize_t n = cores_total.shape[0]
        cdef Py_ssize_t i, j, c, nodes_alloc = n if n > 0 else 1
        cdef Py_ssize_t fr, fwidth, frows, buckets
        cdef str fn = "PlacementCore"
        # A core whose arrays fail the checks below must not be usable (see _ready).
        self.ready = False
        cdef uint8_t[::1] avail_a = np.array(available, dtype=np.uint8, copy=True)
        cdef uint8_t[::1] gfree_a = np.array(gpu_free, dtype=np.uint8, copy=True)
        cdef uint8_t[::1] ffree_a = np.array(fpga_free, dtype=np.uint8, copy=True)
        cdef uint8_t[::1] cfree_a = np.array(core_free, dtype=np.uint8, copy=True)
        cdef int64_t[::1] mfree_a = np.array(mem_free, dtype=np.int64, copy=True)
        cdef int32_t[::1] load_a = (
            np.zeros(n, dtype=np.int32) if load_milli is None
            else np.array(load_milli, dtype=np.int32, copy=True)
        )
        _check_cluster(
            n, cores_total, mem_total, gpu_model, gpu_offsets, gpu_island, gpu_numa, gpu_mem,
            fpga_model, fpga_offsets, numa_offsets, core_offsets, core_numa, leaf,
            switch_parent, switch_level, weight, gpu_dyn_w, fpga_dyn_w, n_gpu_models,
            n_fpga_models, avail_a, gfree_a, ffree_a, cfree_a, mfree_a,
        )
        # The bucket bounds take a row's smallest measured load as a floor of its load term,
        # so a value outside 0..1000 would make a bound (and a score) the model never meant.
        _exact(fn, "load_milli", load_a.shape[0], n, "one per node")
        for i in range(n):
            _in_range(fn, "load_milli", load_a[i], 0, 1000)
        self.n_nodes = n
        self.n_fpga_models = n_fpga_models
        self.n_gpu_models = n_gpu_models
        self.n_switches = switch_parent.shape[0]
        self.cores_total = cores_total
        self.mem_total = mem_total
        self.gpu_model = gpu_model
        self.gpu_offsets = gpu_offsets
        self.gpu_island = gpu_island
        self.gpu_numa = gpu_numa
        self.gpu_mem = gpu_mem
        self.fpga_model = fpga_model
        self.fpga_offsets = fpga_offsets
        self.numa_offsets = numa_offsets
        self.core_offsets = core_offsets
        self.core_numa = core_numa
        self.leaf = leaf
        self.switch_parent = switch_parent
        self.switch_level = switch_level
        self.weight = weight
        self.gpu_dyn_w = gpu_dyn_w
        self.fpga_dyn_w = fpga_dyn_w
        self.available = avail_a
        self.gpu_free = gfree_a
        self.fpga_free = ffree_a
        self.core_free = cfree_a
        self.mem_free = mfree_a
        self.load_milli = load_a

        self.max_gpus = 0
        self.max_numa = 1
        for i in range(n):
            if gpu_offsets[i + 1] - gpu_offsets[i] > self.max_gpus:
                self.max_gpus = gpu_offsets[i + 1] - gpu_offsets[i]
            if numa_offsets[i + 1] - numa_offsets[i] > self.max_numa:
                self.max_numa = numa_offsets[i + 1] - numa_offsets[i]
        self.gpu_free_count = np.zeros(nodes_alloc, dtype=np.int32)
        self.fpga_free_count = np.zeros(nodes_alloc, dtype=np.int32)
        self.numa_free = np.zeros(numa_offsets[n] + 1, dtype=np.int32)
        for i in range(n):
            for j in range(gpu_offsets[i], gpu_offsets[i + 1]):
                self.gpu_free_count[i] += self.gpu_free[j]
            for j in range(fpga_offsets[i], fpga_offsets[i + 1]):
                self.fpga_free_count[i] += self.fpga_free[j]
            for c in range(core_offsets[i], core_offsets[i + 1]):
                self.numa_free[numa_offsets[i] + core_numa[c]] += self.core_free[c]

        width = self.max_gpus + 1
        rows = n_gpu_models + 1
        self.row_min_weight = np.full(rows, -1, dtype=np.int64)
        self.row_min_dyn = np.full(rows, -1, dtype=np.int64)
        self.row_max_island = np.ones(rows, dtype=np.int64)
        self.row_max_cores = np.ones(rows, dtype=np.int64)
        self.row_min_load = np.full(rows, -1, dtype=np.int64)
        for i in range(n):
            r = gpu_model[i] + 1
            if self.row_min_load[r] < 0 or load_a[i] < self.row_min_load[r]:
                self.row_min_load[r] = load_a[i]
            if self.row_min_weight[r] < 0 or weight[i] < self.row_min_weight[r]:
                self.row_min_weight[r] = weight[i]
            if self.row_min_dyn[r] < 0 or gpu_dyn_w[i] < self.row_min_dyn[r]:
                self.row_min_dyn[r] = gpu_dyn_w[i]
            if cores_total[i] > self.row_max_cores[r]:
                self.row_max_cores[r] = cores_total[i]
            for j in range(gpu_offsets[i], gpu_offsets[i + 1]):
                size = 0
                for c in range(gpu_offsets[i], gpu_offsets[i + 1]):
                    size += gpu_island[c] == gpu_island[j]
                if size > self.row_max_island[r]:
                    self.row_max_island[r] = size
        # Third key of the GPU index: the most free GPUs in one NVLink island of the node.
        self.iwidth = 1
        for r in range(rows):
            if self.row_max_island[r] + 1 > self.iwidth:
                self.iwidth = self.row_max_island[r] + 1
        self.n_words = (n + 63) // 64 if n > 0 else 1
        self.b_bits = np.zeros(rows * width * self.iwidth * self.n_words, dtype=np.uint64)
        self.b_count = np.zeros(rows * width * self.iwidth, dtype=np.int32)
        self.b_key = np.full(nodes_alloc, -1, dtype=np.int32)

        # FPGA index (rows = FPGA model + 1) and the static CPU-only node set.
        self.max_fpgas = 0
        self.n_fpga_rows = 1
        for i in range(n):
            if fpga_offsets[i + 1] - fpga_offsets[i] > self.max_fpgas:
                self.max_fpgas = fpga_offsets[i + 1] - fpga_offsets[i]
            if fpga_model[i] + 2 > self.n_fpga_rows:
                self.n_fpga_rows = fpga_model[i] + 2
        fwidth = self.max_fpgas + 1
        frows = self.n_fpga_rows
        self.frow_min_weight = np.full(frows, -1, dtype=np.int64)
        self.frow_min_dyn = np.full(frows, -1, dtype=np.int64)
        self.frow_max_cores = np.ones(frows, dtype=np.int64)
        self.frow_min_load = np.full(frows, -1, dtype=np.int64)
        self.nodev_bits = np.zeros(self.n_words, dtype=np.uint64)
        self.row_nodev = np.zeros(rows, dtype=np.int32)
        for i in range(n):
            fr = fpga_model[i] + 1
            if self.frow_min_weight[fr] < 0 or weight[i] < self.frow_min_weight[fr]:
                self.frow_min_weight[fr] = weight[i]
            if self.frow_min_dyn[fr] < 0 or fpga_dyn_w[i] < self.frow_min_dyn[fr]:
                self.frow_min_dyn[fr] = fpga_dyn_w[i]
            if cores_total[i] > self.frow_max_cores[fr]:
                self.frow_max_cores[fr] = cores_total[i]
            if self.frow_min_load[fr] < 0 or load_a[i] < self.frow_min_load[fr]:
                self.frow_min_load[fr] = load_a[i]
            if gpu_offsets[i + 1] == gpu_offsets[i] and fpga_offsets[i + 1] == fpga_offsets[i]:
                self.nodev_bits[i >> 6] |= (<uint64_t>1) << (i & 63)
                self.row_nodev[gpu_model[i] + 1] += 1
        self.fb_bits = np.zeros(frows * fwidth * self.n_words, dtype=np.uint64)
        self.fb_count = np.zeros(frows * fwidth, dtype=np.int32)
        self.fb_key = np.full(nodes_alloc, -1, dtype=np.int32)
        buckets = rows * width * self.iwidth
        if frows * fwidth > buckets:
            buckets = frows * fwidth
        self.b_order = np.zeros(buckets, dtype=np.int32)
        self.b_lb = np.zeros(buckets, dtype=np.int64)
        for i in range(n):
            if self.available[i]:
                self._index_insert(i)

        self.chooser = GpuChooser(self.max_gpus)
        self.mask = np.zeros(self.max_gpus + 1, dtype=np.uint8)
        self.gout = np.zeros(self.max_gpus + 1, dtype=np.int32)
        self.dom_take = np.zeros(self.max_numa, dtype=np.int32)
        self.dom_used = np.zeros(self.max_numa, dtype=np.uint8)
        self.dom_seen = np.zeros(self.max_numa, dtype=np.int32)
        self.tscr = np.zeros(N_T, dtype=np.int64)
        s_alloc = self.n_switches if self.n_switches > 0 else 1
        self.sw_count = np.zeros(s_alloc, dtype=np.int32)
        self.sw_taken = np.zeros(s_alloc, dtype=np.int32)
        self.sw_sum = np.zeros(s_alloc, dtype=np.int64)
        self.sw_touched = np.zeros(s_alloc, dtype=np.int32)
        self.cand_anc = np.zeros(nodes_alloc, dtype=np.int32)
        self.chosen = np.zeros(nodes_alloc, dtype=np.int32)
        self.mark = np.zeros(nodes_alloc, dtype=np.uint8)
        if self.cands != NULL:
            # __init__ called again on a built core.
            free(self.cands)
        self.cands = <cand_t*>malloc(nodes_alloc * sizeof(cand_t))
        if self.cands == NULL:
            raise MemoryError()
        self.ready = True

    # ------------------------------------------------------------------ boundary checks
    cdef int _check_ready(self, str fn) except -1:
        if not self.ready:
            raise ValueError(f"{fn}: the PlacementCore was never built (its __init__ failed)")
        return 0

    cdef int _check_request(
        self, str fn, Py_ssize_t r, const int64_t[::1] req, const int32_t[::1] mrank,
        const int32_t[::1] frank, const int64_t[::1] w,
    ) except -1:
        """One request's inputs (request ``r`` of a batch, or -1): the vectors' lengths and
        the counts that size the outputs and the free-count updates (a negative count would
        raise a free count past its bucket row)."""
        if (
            req.shape[0] == N_REQ and mrank.shape[0] == self.n_gpu_models
            and frank.shape[0] == self.n_fpga_models and w.shape[0] == N_W
            and 1 <= req[R_NODES] <= _MAX_COUNT and 0 <= req[R_GPUS] <= _MAX_COUNT
            and 0 <= req[R_FPGAS] <= _MAX_COUNT and 0 <= req[R_CORES] <= _MAX_COUNT
        ):
            return 0
        if r >= 0:
            fn = f"{fn} request {r}"
        _exact(fn, "req", req.shape[0], N_REQ, "N_REQ")
        _exact(fn, "mrank", mrank.shape[0], self.n_gpu_models, "one per GPU model")
        _exact(fn, "frank", frank.shape[0], self.n_fpga_models, "one per FPGA model")
        _exact(fn, "w", w.shape[0], N_W, "N_W")
        _in_range(fn, "req[R_NODES]", req[R_NODES], 1, _MAX_COUNT)
        _in_range(fn, "req[R_GPUS]", req[R_GPUS], 0, _MAX_COUNT)
        _in_range(fn, "req[R_FPGAS]", req[R_FPGAS], 0, _MAX_COUNT)
        _in_range(fn, "req[R_CORES]", req[R_CORES], 0, _MAX_COUNT)
        return 0

    # ------------------------------------------------------------------ index
    cdef void _index_insert(self, Py_ssize_t i) noexcept nogil:
        cdef Py_ssize_t j, j2, ga = self.gpu_offsets[i], gb = self.gpu_offsets[i + 1]
        cdef int32_t key, cnt, most = 0
        for j in range(ga, gb):
            if self.gpu_free[j]:
                cnt = 0
                for j2 in range(ga, gb):
                    cnt += self.gpu_free[j2] != 0 and self.gpu_island[j2] == self.gpu_island[j]
                if cnt > most:
                    most = cnt
        key = <int32_t>(
            ((self.gpu_model[i] + 1) * (self.max_gpus + 1) + self.gpu_free_count[i])
            * self.iwidth + most
        )
        self.b_key[i] = key
        self.b_bits[key * self.n_words + (i >> 6)] |= (<uint64_t>1) << (i & 63)
        self.b_count[key] += 1
        key = <int32_t>(
            (self.fpga_model[i] + 1) * (self.max_fpgas + 1) + self.fpga_free_count[i]
        )
        self.fb_key[i] = key
        self.fb_bits[key * self.n_words + (i >> 6)] |= (<uint64_t>1) << (i & 63)
        self.fb_count[key] += 1

    cdef void _index_remove(self, Py_ssize_t i) noexcept nogil:
        cdef int32_t key = self.b_key[i]
        if key < 0:
            return
        self.b_bits[key * self.n_words + (i >> 6)] &= ~((<uint64_t>1) << (i & 63))
        self.b_count[key] -= 1
        self.b_key[i] = -1
        key = self.fb_key[i]
        self.fb_bits[key * self.n_words + (i >> 6)] &= ~((<uint64_t>1) << (i & 63))
        self.fb_count[key] -= 1
        self.fb_key[i] = -1

    # ------------------------------------------------------------------ one node
    cdef int _eval(
        self, Py_ssize_t i, const int64_t[::1] req, const int32_t[::1] mrank,
        const int32_t[::1] frank, int64_t* terms, bint write,
        int32_t* gpus_out, int32_t* fpgas_out, int32_t* cores_out,
    ) noexcept nogil:
        """Evaluate node i for the request; fill terms (and, when write, the choices).

        Returns ST_FITS or the first ST_* constraint that fails (terms then undefined).
        """
        cdef int64_t ng = req[R_GPUS], nf = req[R_FPGAS], nc = req[R_CORES]
        cdef Py_ssize_t ga = self.gpu_offsets[i], gb = self.gpu_offsets[i + 1]
        cdef Py_ssize_t fa = self.fpga_offsets[i], fb = self.fpga_offsets[i + 1]
        cdef Py_ssize_t da = self.numa_offsets[i], nd = self.numa_offsets[i + 1] - da
        cdef Py_ssize_t ca = self.core_offsets[i], cb = self.core_offsets[i + 1]
        cdef Py_ssize_t j, d, t, bf, lg, qual = 0, freeq = 0, span = 0
        cdef int64_t rem, f, free_cores = 0, islands = 0
        cdef int32_t gm = self.gpu_model[i], fm = self.fpga_model[i]
        cdef score_t packed
        cdef uint8_t ok
        if not self.available[i]:
            return ST_UNAVAILABLE
        if req[R_CPU_ONLY] and (gb > ga or fb > fa):
            return ST_CPU_ONLY
        if ng > 0:
            if gm < 0 or mrank[gm] < 0:
                return ST_GPU_MODEL
            if gb - ga < ng:
                return ST_GPU_COUNT
            for j in range(ga, gb):
                ok = self.gpu_mem[j] >= req[R_MIN_GPU_MEM]
                qual += ok
                ok = ok and self.gpu_free[j]
                self.mask[j - ga] = ok
                freeq += ok
            if qual < ng:
                return ST_GPU_MEM
            if freeq < ng:
                return ST_GPU_FREE
            packed = self.chooser.choose(
                self.mask[:gb - ga], self.gpu_island[ga:gb], self.gpu_numa[ga:gb], ng, self.gout
            )
            islands = packed >> SCORE_ISLAND_SHIFT
            if req[R_NVLINK] and islands > 1:
                return ST_NVLINK
        if nf > 0:
            if fm < 0 or frank[fm] < 0:
                return ST_FPGA_MODEL
            if fb - fa < nf:
                return ST_FPGA_COUNT
            if self.fpga_free_count[i] < nf:
                return ST_FPGA_FREE
        for d in range(nd):
            free_cores += self.numa_free[da + d]
            self.dom_take[d] = 0
            self.dom_used[d] = 0
        if free_cores < nc:
            return ST_CORES
        # Cores come from the chosen GPUs' NUMA domains first (host-device traffic stays on
        # the socket), then greedily: a domain that holds the rest alone (the fullest-used
        # one, best fit), else the domain with the most free cores (fewest domains).
        for t in range(ng):
            self.dom_used[self.gpu_numa[ga + self.gout[t]]] = 1
        rem = nc
        for d in range(nd):
            if self.dom_used[d] and rem > 0:
                f = self.numa_free[da + d]
                if f > rem:
                    f = rem
                self.dom_take[d] = <int32_t>f
                rem -= f
        while rem > 0:
            bf = -1
            lg = -1
            for d in range(nd):
                f = self.numa_free[da + d]
                if self.dom_used[d] or f <= 0:
                    continue
                if f >= rem and (bf < 0 or f < self.numa_free[da + bf]):
                    bf = d
                if lg < 0 or f > self.numa_free[da + lg]:
                    lg = d
            if bf >= 0:
                self.dom_take[bf] = <int32_t>rem
                self.dom_used[bf] = 1
                rem = 0
            elif lg >= 0:
                self.dom_take[lg] = self.numa_free[da + lg]
                self.dom_used[lg] = 1
                rem -= self.numa_free[da + lg]
            else:
                return ST_CORES
        for d in range(nd):
            span += self.dom_used[d]
        if req[R_NUMA] and span > 1:
            return ST_NUMA
        if self.mem_free[i] < req[R_MEM]:
            return ST_MEMORY

        terms[T_MODEL] = (mrank[gm] if ng > 0 else 0) + (frank[fm] if nf > 0 else 0)
        terms[T_ISLANDS] = islands - 1 if islands > 0 else 0
        terms[T_NUMA] = span - 1 if span > 0 else 0
        terms[T_LEFTOVER] = self.gpu_free_count[i] - ng + self.fpga_free_count[i] - nf
        # The larger of the allocated share and the measured load: both say how busy the
        # node is, and a job counted in one is usually seen by the other (a sum would count
        # it twice). Unknown measurements are 0, so they never raise the term.
        terms[T_LOAD] = (self.cores_total[i] - free_cores + nc) * 1000 // self.cores_total[i]
        if self.load_milli[i] > terms[T_LOAD]:
            terms[T_LOAD] = self.load_milli[i]
        terms[T_ENERGY] = ng * self.gpu_dyn_w[i] + nf * self.fpga_dyn_w[i]
        terms[T_WEIGHT] = self.weight[i]
        if not write:
            return ST_FITS
        for t in range(ng):
            gpus_out[t] = self.gout[t]
        t = 0
        for j in range(fa, fb):
            if t == nf:
                break
            if self.fpga_free[j]:
                fpgas_out[t] = <int32_t>(j - fa)
                t += 1
        for d in range(nd):
            self.dom_seen[d] = 0
        t = 0
        for j in range(ca, cb):
            if self.core_free[j]:
                d = self.core_numa[j]
                if self.dom_seen[d] < self.dom_take[d]:
                    cores_out[t] = <int32_t>(j - ca)
                    self.dom_seen[d] += 1
                    t += 1
        return ST_FITS

    cdef int _static(
        self, Py_ssize_t i, const int64_t[::1] req, const int32_t[::1] mrank,
        const int32_t[::1] frank,
    ) noexcept nogil:
        """The tests of ``_eval`` that no free state changes, in its order: ST_FITS when node
        i could hold one share of the request once everything on it is free, else the first
        that fails (unavailable, cpu_only, gpu_model, gpu_count, gpu_mem, fpga_model,
        fpga_count). Where this is not ST_FITS, ``_eval`` fails on every state."""
        cdef int64_t ng = req[R_GPUS], nf = req[R_FPGAS]
        cdef Py_ssize_t ga = self.gpu_offsets[i], gb = self.gpu_offsets[i + 1]
        cdef Py_ssize_t fa = self.fpga_offsets[i], fb = self.fpga_offsets[i + 1]
        cdef Py_ssize_t j, qual = 0
        cdef int32_t gm = self.gpu_model[i], fm = self.fpga_model[i]
        if not self.available[i]:
            return ST_UNAVAILABLE
        if req[R_CPU_ONLY] and (gb > ga or fb > fa):
            return ST_CPU_ONLY
        if ng > 0:
            if gm < 0 or mrank[gm] < 0:
                return ST_GPU_MODEL
            if gb - ga < ng:
                return ST_GPU_COUNT
            for j in range(ga, gb):
                qual += self.gpu_mem[j] >= req[R_MIN_GPU_MEM]
            if qual < ng:
                return ST_GPU_MEM
        if nf > 0:
            if fm < 0 or frank[fm] < 0:
                return ST_FPGA_MODEL
            if fb - fa < nf:
                return ST_FPGA_COUNT
        return ST_FITS

    cdef void _commit(
        self, Py_ssize_t i, const int64_t[::1] req, const int32_t* gpus, const int32_t* fpgas,
        const int32_t* cores,
    ) noexcept nogil:
        """Take node i's chosen devices, cores and memory out of the free state and index."""
        cdef Py_ssize_t t, c
        cdef Py_ssize_t ga = self.gpu_offsets[i], fa = self.fpga_offsets[i]
        cdef Py_ssize_t ca = self.core_offsets[i], da = self.numa_offsets[i]
        self._index_remove(i)
        for t in range(req[R_GPUS]):
            self.gpu_free[ga + gpus[t]] = 0
        self.gpu_free_count[i] -= <int32_t>req[R_GPUS]
        for t in range(req[R_FPGAS]):
            self.fpga_free[fa + fpgas[t]] = 0
        self.fpga_free_count[i] -= <int32_t>req[R_FPGAS]
        for t in range(req[R_CORES]):
            c = ca + cores[t]
            self.core_free[c] = 0
            self.numa_free[da + self.core_numa[c]] -= 1
        self.mem_free[i] -= req[R_MEM]
        self._index_insert(i)

    # ------------------------------------------------------------------ one request
    cdef bint _set_before(self, Py_ssize_t a, Py_ssize_t b, Py_ssize_t n_c, int64_t k) noexcept nogil:
        """Whether switch a's k best nodes sort before switch b's as ascending node tuples.

        Both sets have k members, so the smaller tuple is the one holding the smallest node
        of the symmetric difference.
        """
        cdef Py_ssize_t x, ta = 0, tb = 0
        cdef int32_t node, best = -1
        cdef bint in_a = False
        for x in range(n_c):
            node = self.cands[x].node
            if self.cand_anc[x] == a and ta < k:
                self.mark[node] |= 1
                ta += 1
            elif self.cand_anc[x] == b and tb < k:
                self.mark[node] |= 2
                tb += 1
        for x in range(n_c):
            node = self.cands[x].node
            if (self.mark[node] == 1 or self.mark[node] == 2) and (best < 0 or node < best):
                best = node
                in_a = self.mark[node] == 1
        for x in range(n_c):
            self.mark[self.cands[x].node] = 0
        return in_a

    cdef int _place(
        self, const int64_t[::1] req, const int32_t[::1] mrank, const int32_t[::1] frank,
        const int64_t[::1] w, bint commit, int32_t* nodes_out, int32_t* gpus_out,
        int32_t* fpgas_out, int32_t* cores_out, int64_t* terms_out, int64_t* info,
    ) noexcept nogil:
        cdef int64_t k = req[R_NODES], ng = req[R_GPUS], nf = req[R_FPGAS], nc = req[R_CORES]
        cdef Py_ssize_t width = self.max_gpus + 1, row, c, c0, x, y, r, n_c = 0, nt = 0, nb
        cdef Py_ssize_t touched = 0
        cdef int32_t i, s, best = -1, level = -1, best_leaf = 0, best_node = -1
        cdef int64_t total = 0, taken, lb, score, best_score = 0
        cdef Py_ssize_t base, word, c1, mi, bk, y2
        cdef uint64_t bits
        cdef const uint64_t* bitsrc
        cdef const uint64_t* cpu_mask = NULL
        cdef bint stop
        cdef int status = PL_PLACED
        for x in range(N_INFO):
            info[x] = -1
        # Only nodes without devices can hold a CPU-only request: mask the rest out.
        if req[R_CPU_ONLY]:
            cpu_mask = &self.nodev_bits[0]
        # Buckets to visit, with a lower bound on the score of any node in them: the model
        # rank of the row, leftover >= free devices of the bucket - asked, the row's smallest
        # weight and device watts, load >= max(asked cores / the row's largest node, the
        # row's smallest measured load) (each is <= one operand of the node's max); islands
        # and NUMA terms are >= 0. Requests with GPUs
        # walk the GPU index; FPGA-only requests walk the FPGA index (a node that fits has an
        # allowed FPGA model and >= nf free FPGAs); the rest walk the GPU index whole, or only
        # its zero-free-GPU buckets for CPU-only requests.
        nb = 0
        bitsrc = &self.b_bits[0]
        if ng == 0 and nf > 0:
            bitsrc = &self.fb_bits[0]
            width = self.max_fpgas + 1
            for row in range(1, self.n_fpga_rows):
                if frank[row - 1] < 0 or self.frow_min_weight[row] < 0:
                    continue
                for c in range(nf, width):
                    if self.fb_count[row * width + c] == 0:
                        continue
                    lb = (
                        w[T_MODEL] * frank[row - 1]
                        + w[T_LEFTOVER] * (c - nf)
                        + w[T_WEIGHT] * self.frow_min_weight[row]
                        + w[T_ENERGY] * nf * self.frow_min_dyn[row]
                        + w[T_LOAD] * _max64(nc * 1000 // self.frow_max_cores[row],
                                             self.frow_min_load[row])
                    )
                    self.b_lb[nb] = lb
                    self.b_order[nb] = <int32_t>(row * width + c)
                    nb += 1
        for row in range(self.n_gpu_models + 1):
            if ng == 0 and nf > 0:
                break
            if ng > 0 and (row == 0 or mrank[row - 1] < 0):
                continue
            if self.row_min_weight[row] < 0:
                continue
            c0 = ng if ng > 0 else 0
            c1 = width
            if cpu_mask != NULL:
                if self.row_nodev[row] == 0:
                    continue
                # A node with a free GPU has a GPU.
                c1 = c0 + 1
            for c in range(c0, c1):
                for mi in range(self.iwidth):
                    bk = (row * width + c) * self.iwidth + mi
                    if self.b_count[bk] == 0:
                        continue
                    lb = (
                        (w[T_MODEL] * mrank[row - 1] if ng > 0 else 0)
                        + w[T_LEFTOVER] * (c - ng)
                        + w[T_WEIGHT] * self.row_min_weight[row]
                        + w[T_ENERGY] * ng * self.row_min_dyn[row]
                        + w[T_LOAD] * _max64(nc * 1000 // self.row_max_cores[row],
                                             self.row_min_load[row])
                    )
                    if ng > 0:
                        # The chosen GPUs span >= ng / mi islands (rounded up) when at most mi
                        # free GPUs share one; with NVLink required that must be one island.
                        if mi == 0 or (req[R_NVLINK] and mi < ng):
                            continue
                        lb += w[T_ISLANDS] * ((ng + mi - 1) // mi - 1)
                    self.b_lb[nb] = lb
                    self.b_order[nb] = <int32_t>bk
                    nb += 1
        # A single node is the best (score, index) pair, so once the best found is below a
        # bucket's bound, or equal to it with a lower index than the rest of the (ascending)
        # bucket, nothing left can win. Multi-node requests need every fitting node's switch
        # path, so they visit every bucket.
        stop = False
        for y in range(nb):
            if k == 1:
                # Lowest bound next (selection: a single-node search usually stops after the
                # first bucket or two, so sorting them all would cost more).
                y2 = y
                for x in range(y + 1, nb):
                    if self.b_lb[x] < self.b_lb[y2]:
                        y2 = x
                if y2 != y:
                    lb = self.b_lb[y2]
                    self.b_lb[y2] = self.b_lb[y]
                    self.b_lb[y] = lb
                    r = self.b_order[y2]
                    self.b_order[y2] = self.b_order[y]
                    self.b_order[y] = <int32_t>r
            lb = self.b_lb[y]
            if k == 1 and best_node >= 0 and lb > best_score:
                break
            base = self.b_order[y] * self.n_words
            for word in range(self.n_words):
                bits = bitsrc[base + word]
                if cpu_mask != NULL:
                    bits &= cpu_mask[word]
                while bits != 0:
                    i = <int32_t>(word * 64 + __builtin_ctzll(bits))
                    bits &= bits - 1
                    if k == 1 and best_node >= 0 and lb == best_score and i > best_node:
                        # Ascending bitset: the rest of this bucket can at best tie, later.
                        stop = True
                        break
                    touched += 1
                    if self._eval(
                        i, req, mrank, frank, &self.tscr[0], False, NULL, NULL, NULL
                    ) == ST_FITS:
                        score = _weigh(&self.tscr[0], w)
                        self.cands[n_c].score = score
                        self.cands[n_c].node = i
                        n_c += 1
                        if best_node < 0 or score < best_score or (
                            score == best_score and i < best_node
                        ):
                            best_score = score
                            best_node = i
                if stop:
                    stop = False
                    break
        info[I_TOUCHED] = touched
        info[I_FITTING] = n_c
        qsort(self.cands, n_c, sizeof(cand_t), _cmp_cand)

        for x in range(n_c):
            s = self.leaf[self.cands[x].node]
            while s >= 0:
                if self.sw_count[s] == 0:
                    self.sw_touched[nt] = s
                    nt += 1
                self.sw_count[s] += 1
                s = self.switch_parent[s]
        for y in range(nt):
            s = self.sw_touched[y]
            if self.switch_level[s] == 0 and self.sw_count[s] > best_leaf:
                best_leaf = self.sw_count[s]
            if self.sw_count[s] >= k and (level < 0 or self.switch_level[s] < level):
                level = self.switch_level[s]
        info[I_BEST_LEAF] = best_leaf
        if n_c < k or level < 0:
            status = PL_FEW_NODES
        elif req[R_SWITCH] and level > 0:
            status = PL_SWITCH
        else:
            for x in range(n_c):
                s = self.leaf[self.cands[x].node]
                while s >= 0 and self.switch_level[s] < level:
                    s = self.switch_parent[s]
                if s >= 0 and self.switch_level[s] != level:
                    # This path skips level L (an unbalanced tree): no level-L switch holds it.
                    s = -1
                self.cand_anc[x] = s
                if s >= 0 and self.sw_taken[s] < k:
                    self.sw_taken[s] += 1
                    self.sw_sum[s] += self.cands[x].score
            for y in range(nt):
                s = self.sw_touched[y]
                if self.switch_level[s] != level or self.sw_taken[s] != k:
                    continue
                if (
                    best < 0
                    or self.sw_sum[s] < self.sw_sum[best]
                    or (self.sw_sum[s] == self.sw_sum[best] and self._set_before(s, best, n_c, k))
                ):
                    best = s
            taken = 0
            for x in range(n_c):
                if self.cand_anc[x] == best and taken < k:
                    self.chosen[taken] = self.cands[x].node
                    taken += 1
                elif info[I_NEXT_NODE] < 0:
                    info[I_NEXT_NODE] = self.cands[x].node
                    info[I_NEXT_SCORE] = self.cands[x].score
            qsort(&self.chosen[0], k, sizeof(int32_t), _cmp_i32)
            for r in range(k):
                i = self.chosen[r]
                nodes_out[r] = i
                self._eval(
                    i, req, mrank, frank, terms_out + r * N_T, True,
                    gpus_out + r * ng, fpgas_out + r * nf, cores_out + r * nc,
                )
                total += _weigh(terms_out + r * N_T, w)
            info[I_TOTAL] = total + w[W_SWITCH] * level
            info[I_LEVELS] = level
            info[I_SWITCH] = best
            if commit:
                # After every node is evaluated: committing changes only the node committed,
                # but the evaluations above share scratch space with nothing else.
                for r in range(k):
                    self._commit(
                        self.chosen[r], req, gpus_out + r * ng, fpgas_out + r * nf,
                        cores_out + r * nc,
                    )
        for y in range(nt):
            s = self.sw_touched[y]
            self.sw_count[s] = 0
            self.sw_taken[s] = 0
            self.sw_sum[s] = 0
        return status

    # ------------------------------------------------------------------ Python entry points
    def place(
        self,
        const int64_t[::1] req not None,
        const int32_t[::1] mrank not None,
        const int32_t[::1] frank not None,
        const int64_t[::1] w not None,
        bint commit,
        int32_t[::1] nodes_out not None,
        int32_t[::1] gpus_out not None,
        int32_t[::1] fpgas_out not None,
        int32_t[::1] cores_out not None,
        int64_t[::1] terms_out not None,
        int64_t[::1] info not None,
    ):
        """Place one request; trusts its inputs (``hetslurm.placement.place`` validates).

        Args:
            req: shape (N_REQ,), int64; fields R_*.
            mrank: shape (n_gpu_models,), int32; rank of each GPU model in the request, -1 =
                not allowed.
            frank: shape (n_fpga_models,), int32; same for FPGA models.
            w: shape (N_W,), int64 >= 0; weights of the T_* terms, then W_SWITCH.
            commit: consume the chosen resources (state and index) when placed.
            nodes_out: shape (>= max(k, 1),), int32; chosen node indices, ascending.
            gpus_out, fpgas_out, cores_out: shape (>= max(k * per_node, 1),), int32; node r's
                node-local indices at [r * per_node, (r + 1) * per_node), ascending.
            terms_out: shape (>= k * N_T,), int64; node r's terms at [r * N_T, ...).
            info: shape (N_INFO,), int64; fields I_* (-1 where undefined).

        Returns:
            int: PL_PLACED, PL_FEW_NODES or PL_SWITCH. Outputs other than info are written
            only when placed.

        Raises:
            ValueError: an input of the wrong length, a count out of range, or an output
                shorter than the request's k nodes need (checked before anything is written).
        """
        cdef str fn = "PlacementCore.place"
        self._check_ready(fn)
        self._check_request(fn, -1, req, mrank, frank, w)
        cdef int64_t k = req[R_NODES]
        _at_least(fn, "nodes_out", nodes_out.shape[0], k, "req[R_NODES]")
        _at_least(fn, "gpus_out", gpus_out.shape[0], max(k * req[R_GPUS], 1),
                  "req[R_NODES] * req[R_GPUS], at least 1")
        _at_least(fn, "fpgas_out", fpgas_out.shape[0], max(k * req[R_FPGAS], 1),
                  "req[R_NODES] * req[R_FPGAS], at least 1")
        _at_least(fn, "cores_out", cores_out.shape[0], max(k * req[R_CORES], 1),
                  "req[R_NODES] * req[R_CORES], at least 1")
        _at_least(fn, "terms_out", terms_out.shape[0], k * N_T, "req[R_NODES] * N_T")
        _at_least(fn, "info", info.shape[0], N_INFO, "N_INFO")
        cdef int status
        with nogil:
            status = self._place(
                req, mrank, frank, w, commit, &nodes_out[0], &gpus_out[0], &fpgas_out[0],
                &cores_out[0], &terms_out[0], &info[0],
            )
        return status

    def place_batch(
        self,
        const int64_t[:, ::1] reqs not None,
        const int32_t[:, ::1] mranks not None,
        const int32_t[:, ::1] franks not None,
        const int64_t[:, ::1] ws not None,
        const int64_t[::1] node_off not None,
        const int64_t[::1] gpu_off not None,
        const int64_t[::1] fpga_off not None,
        const int64_t[::1] core_off not None,
        int32_t[::1] nodes_out not None,
        int32_t[::1] gpus_out not None,
        int32_t[::1] fpgas_out not None,
        int32_t[::1] cores_out not None,
        int64_t[::1] terms_out not None,
        int8_t[::1] status not None,
        int64_t[:, ::1] info not None,
    ):
        """Place R requests in order, each consuming what it gets, in one GIL-free loop.

        Args:
            reqs: shape (R, N_REQ), int64. mranks: (R, n_gpu_models) int32. franks:
                (R, n_fpga_models) int32. ws: (R, N_W) int64.
            node_off: shape (R + 1,), int64; request r writes nodes_out[node_off[r]:...]
                (k_r entries) and terms_out[node_off[r] * N_T:...].
            gpu_off, fpga_off, core_off: shape (R + 1,), int64; flat offsets of request r's
                device and core indices (k_r * per-node count entries).
            nodes_out, gpus_out, fpgas_out, cores_out: int32, at least one entry each.
            terms_out: int64, shape (>= node_off[R] * N_T,), at least one entry.
            status: shape (R,), int8; receives PL_* per request.
            info: shape (R, N_INFO), int64; receives I_* per request.

        Raises:
            ValueError: inputs not one row per request or rows of the wrong width, a count
                out of range, or an offset whose request would write outside its output
                (every request is checked before the first is placed).
        """
        cdef str fn = "PlacementCore.place_batch"
        cdef Py_ssize_t r, n_req = reqs.shape[0]
        cdef int64_t k
        self._check_ready(fn)
        for name, have in (
            ("mranks", mranks.shape[0]), ("franks", franks.shape[0]), ("ws", ws.shape[0]),
            ("status", status.shape[0]), ("info", info.shape[0]),
        ):
            _exact(fn, name, have, n_req, "one row per request in reqs")
        for name, have in (
            ("node_off", node_off.shape[0]), ("gpu_off", gpu_off.shape[0]),
            ("fpga_off", fpga_off.shape[0]), ("core_off", core_off.shape[0]),
        ):
            _exact(fn, name, have, n_req + 1, "one more than the requests")
        _exact(fn, "info columns", info.shape[1], N_INFO, "N_INFO")
        for name, have in (
            ("nodes_out", nodes_out.shape[0]), ("gpus_out", gpus_out.shape[0]),
            ("fpgas_out", fpgas_out.shape[0]), ("cores_out", cores_out.shape[0]),
            ("terms_out", terms_out.shape[0]),
        ):
            _at_least(fn, name, have, 1, "&out[0] is taken")
        for r in range(n_req):
            self._check_request(fn, r, reqs[r], mranks[r], franks[r], ws[r])
            k = reqs[r, R_NODES]
            _out_span(fn, r, "node_off", "nodes_out", node_off[r], k, nodes_out.shape[0])
            _out_span(fn, r, "node_off", "terms_out", node_off[r] * N_T if node_off[r] >= 0
                      else -1, k * N_T, terms_out.shape[0])
            _out_span(fn, r, "gpu_off", "gpus_out", gpu_off[r], k * reqs[r, R_GPUS],
                      gpus_out.shape[0])
            _out_span(fn, r, "fpga_off", "fpgas_out", fpga_off[r], k * reqs[r, R_FPGAS],
                      fpgas_out.shape[0])
            _out_span(fn, r, "core_off", "cores_out", core_off[r], k * reqs[r, R_CORES],
                      cores_out.shape[0])
        with nogil:
            for r in range(n_req):
                status[r] = <int8_t>self._place(
                    reqs[r], mranks[r], franks[r], ws[r], True,
                    &nodes_out[0] + node_off[r], &gpus_out[0] + gpu_off[r],
                    &fpgas_out[0] + fpga_off[r], &cores_out[0] + core_off[r],
                    &terms_out[0] + node_off[r] * N_T, &info[r, 0],
                )

    def take(
        self,
        Py_ssize_t node,
        const int32_t[::1] gpus not None,
        const int32_t[::1] fpgas not None,
        const int32_t[::1] cores not None,
        int64_t mem,
    ):
        """Mark node-local devices, cores and memory of one node busy, in the state and the
        index, as a core built from the same arrays with them marked busy would hold them.

        For callers that take what a placement chose after adjusting it (the GPUs Slurm will
        pick rather than the kernel's), where ``commit`` would take the kernel's choice. Busy
        entries stay busy (taking one twice changes nothing); memory floors at 0; a node
        outside the index (unavailable) stays outside it. The aggregates the kernels bound
        with (per-row weights, watts, cores, load) depend on the static arrays only, so the
        core answers every request as a freshly built one would.

        Args:
            node: node index, 0 <= node < N.
            gpus, fpgas, cores: int32; node-local indices (within the node's counts).
            mem: MiB to take (>= 0).

        Raises:
            ValueError: an index outside the node, or a negative ``mem`` (nothing is taken).
        """
        cdef str fn = "PlacementCore.take"
        self._check_ready(fn)
        _in_range(fn, "node", node, 0, self.n_nodes - 1)
        _in_range(fn, "mem", mem, 0, (<int64_t>1) << 62)
        cdef Py_ssize_t t, c
        cdef Py_ssize_t ga = self.gpu_offsets[node], ng = self.gpu_offsets[node + 1] - ga
        cdef Py_ssize_t fa = self.fpga_offsets[node], nf = self.fpga_offsets[node + 1] - fa
        cdef Py_ssize_t ca = self.core_offsets[node], nc = self.core_offsets[node + 1] - ca
        cdef Py_ssize_t da = self.numa_offsets[node]
        for t in range(gpus.shape[0]):
            _in_range(fn, "gpus[]", gpus[t], 0, ng - 1)
        for t in range(fpgas.shape[0]):
            _in_range(fn, "fpgas[]", fpgas[t], 0, nf - 1)
        for t in range(cores.shape[0]):
            _in_range(fn, "cores[]", cores[t], 0, nc - 1)
        with nogil:
            self._index_remove(node)
            for t in range(gpus.shape[0]):
                if self.gpu_free[ga + gpus[t]]:
                    self.gpu_free[ga + gpus[t]] = 0
                    self.gpu_free_count[node] -= 1
            for t in range(fpgas.shape[0]):
                if self.fpga_free[fa + fpgas[t]]:
                    self.fpga_free[fa + fpgas[t]] = 0
                    self.fpga_free_count[node] -= 1
            for t in range(cores.shape[0]):
                c = ca + cores[t]
                if self.core_free[c]:
                    self.core_free[c] = 0
                    self.numa_free[da + self.core_numa[c]] -= 1
            self.mem_free[node] = self.mem_free[node] - mem if self.mem_free[node] > mem else 0
            if self.available[node]:
                self._index_insert(node)

    def refresh(
        self,
        const int64_t[::1] nodes not None,
        const uint8_t[::1] available not None,
        const uint8_t[::1] gpu_free not None,
        const uint8_t[::1] fpga_free not None,
        const uint8_t[::1] core_free not None,
        const int64_t[::1] mem_free not None,
    ):
        """Set the state of ``nodes`` from whole-cluster state arrays, in the state and the
        index, as a core built from those arrays holds them: what was taken elsewhere is
        busy here, what was given back is free again (memory below 0 reads as 0). Nodes
        not named keep what they have.

        For callers that keep one core per node mask over a state that changes (the
        simulator: a job that ends gives its resources back; a commit on another mask's core
        takes them), where rebuilding the core would copy every array. The aggregates the
        kernels bound with depend on the static arrays only, so the core answers every
        request as a freshly built one would.

        Args:
            nodes: int64 node indices (repeats allowed).
            available: uint8 (N,); gpu_free (G,), fpga_free (F,), core_free (C,) uint8,
                1 = free; mem_free int64 (N,) MiB.

        Raises:
            ValueError: an array of the wrong length or a node outside 0..N-1 (nothing is
                changed).
        """
        cdef str fn = "PlacementCore.refresh"
        self._check_ready(fn)
        cdef Py_ssize_t n = self.n_nodes
        _exact(fn, "available", available.shape[0], n, "one per node")
        _exact(fn, "gpu_free", gpu_free.shape[0], self.gpu_offsets[n], "one per GPU")
        _exact(fn, "fpga_free", fpga_free.shape[0], self.fpga_offsets[n], "one per FPGA")
        _exact(fn, "core_free", core_free.shape[0], self.core_offsets[n], "one per core")
        _exact(fn, "mem_free", mem_free.shape[0], n, "one per node")
        cdef Py_ssize_t t, i, j, c, da
        for t in range(nodes.shape[0]):
            _in_range(fn, "nodes[]", nodes[t], 0, n - 1)
        with nogil:
            for t in range(nodes.shape[0]):
                i = nodes[t]
                self._index_remove(i)
                self.gpu_free_count[i] = 0
                for j in range(self.gpu_offsets[i], self.gpu_offsets[i + 1]):
                    self.gpu_free[j] = gpu_free[j] != 0
                    self.gpu_free_count[i] += self.gpu_free[j]
                self.fpga_free_count[i] = 0
                for j in range(self.fpga_offsets[i], self.fpga_offsets[i + 1]):
                    self.fpga_free[j] = fpga_free[j] != 0
                    self.fpga_free_count[i] += self.fpga_free[j]
                da = self.numa_offsets[i]
                for j in range(da, self.numa_offsets[i + 1]):
                    self.numa_free[j] = 0
                for c in range(self.core_offsets[i], self.core_offsets[i + 1]):
                    self.core_free[c] = core_free[c] != 0
                    self.numa_free[da + self.core_numa[c]] += self.core_free[c]
                self.mem_free[i] = mem_free[i] if mem_free[i] > 0 else 0
                self.available[i] = available[i] != 0
                if self.available[i]:
                    self._index_insert(i)

    def evaluate(
        self,
        const int64_t[::1] req not None,
        const int32_t[::1] mrank not None,
        const int32_t[::1] frank not None,
        const int64_t[::1] w not None,
        int8_t[::1] status not None,
        int64_t[::1] terms not None,
        int64_t[::1] scores not None,
    ):
        """Evaluate every node (index bypassed): for explanations and tests.

        Args:
            req, mrank, frank, w: as for ``place``.
            status: shape (N,), int8; ST_* per node.
            terms: shape (>= N * N_T,), int64, at least one entry; node i's terms at
                [i * N_T, ...), valid where status is ST_FITS.
            scores: shape (N,), int64; node score where it fits, -1 elsewhere.

        Raises:
            ValueError: an input of the wrong length or a count out of range; an output
                shorter than one entry (``terms``: N_T entries) per node.
        """
        cdef str fn = "PlacementCore.evaluate"
        self._check_ready(fn)
        self._check_request(fn, -1, req, mrank, frank, w)
        _at_least(fn, "status", status.shape[0], self.n_nodes, "one per node")
        _at_least(fn, "terms", terms.shape[0], max(self.n_nodes * N_T, 1),
                  "N_T per node, at least 1")
        _at_least(fn, "scores", scores.shape[0], self.n_nodes, "one per node")
        cdef Py_ssize_t i
        cdef int st
        with nogil:
            for i in range(self.n_nodes):
                st = self._eval(
                    i, req, mrank, frank, &terms[0] + i * N_T, False, NULL, NULL, NULL
                )
                status[i] = <int8_t>st
                scores[i] = _weigh(&terms[0] + i * N_T, w) if st == ST_FITS else -1

    def static_fit(
        self,
        const int64_t[::1] req not None,
        const int32_t[::1] mrank not None,
        const int32_t[::1] frank not None,
        int8_t[::1] status not None,
    ):
        """Which nodes could ever hold one share of the request: the tests of ``evaluate``
        that no free GPU, FPGA, core or memory changes (availability, CPU-only, device
        models and counts, GPU memory), for callers that keep free counts themselves.

        Args:
            req, mrank, frank: as for ``place``.
            status: shape (N,), int8; ST_FITS, or the first static ST_* that fails.

        Raises:
            ValueError: an input of the wrong length or a count out of range; ``status``
                shorter than one entry per node.
        """
        cdef str fn = "PlacementCore.static_fit"
        self._check_ready(fn)
        _exact(fn, "req", req.shape[0], N_REQ, "N_REQ")
        _exact(fn, "mrank", mrank.shape[0], self.n_gpu_models, "one per GPU model")
        _exact(fn, "frank", frank.shape[0], self.n_fpga_models, "one per FPGA model")
        _in_range(fn, "req[R_GPUS]", req[R_GPUS], 0, _MAX_COUNT)
        _in_range(fn, "req[R_FPGAS]", req[R_FPGAS], 0, _MAX_COUNT)
        _at_least(fn, "status", status.shape[0], self.n_nodes, "one per node")
        cdef Py_ssize_t i
        with nogil:
            for i in range(self.n_nodes):
                status[i] = <int8_t>self._static(i, req, mrank, frank)

    def state(self):
        """Copies of the live state arrays: dict of name to numpy array."""
        self._check_ready("PlacementCore.state")
        return {
            "available": np.array(self.available, dtype=np.uint8),
            "gpu_free": np.array(self.gpu_free, dtype=np.uint8),
            "fpga_free": np.array(self.fpga_free, dtype=np.uint8),
            "core_free": np.array(self.core_free, dtype=np.uint8),
            "mem_free": np.array(self.mem_free, dtype=np.int64),
        }

    def index_buckets(self):
        """The free-capacity index as {(gpu model id, free GPUs, most free GPUs in one
        NVLink island): [nodes]} (for tests)."""
        self._check_ready("PlacementCore.index_buckets")
        out = {}
        width = self.max_gpus + 1
        for key in range(self.b_count.shape[0]):
            members = [
                i for i in range(self.n_nodes)
                if (int(self.b_bits[key * self.n_words + (i >> 6)]) >> (i & 63)) & 1
            ]
            assert len(members) == self.b_count[key]
            if members:
                row, isl = divmod(key, self.iwidth)
                out[(row // width - 1, row % width, isl)] = members
        return out

    def fpga_index_buckets(self):
        """The FPGA index as {(fpga model id, free FPGAs): [nodes]} (for tests)."""
        self._check_ready("PlacementCore.fpga_index_buckets")
        out = {}
        width = self.max_fpgas + 1
        for key in range(self.fb_count.shape[0]):
            members = [
                i for i in range(self.n_nodes)
                if (int(self.fb_bits[key * self.n_words + (i >> 6)]) >> (i & 63)) & 1
            ]
            assert len(members) == self.fb_count[key]
            if members:
                out[(key // width - 1, key % width)] = members
        return out


# --- Whole-node reservations of a backfill pass ----------------------------------------------
# Slurm's backfill (sched/backfill, conservative) gives each pending job it tests a reservation
# of whole nodes for its time limit. The simulator's `slurm` model (hetslurm.simulate.
# slurm_backfill) asks, for every tested job, the earliest time a shape fits on nodes free of
# those reservations; NodeSpans answers from per-node span lists in C.
# hetslurm.placement.spans.NodeSpansReference is the same rule in plain Python.

cdef int _cmp_double(const void *a, const void *b) noexcept nogil:
    cdef double x = (<const double *>a)[0]
    cdef double y = (<const double *>b)[0]
    return (x > y) - (x < y)


cdef class NodeSpans:
    """The whole-node reservations of one backfill pass: per node its spans ``[start, end)``
    sorted by start (disjoint: a reservation only takes nodes free of others for its window).

    ``earliest_one`` and ``earliest_multi`` answer a shape's earliest start given, per node,
    the earliest time one share fits there with reservations aside (``raw``: ``inf`` where
    never); ``feasible_last`` is the node set of the last ``earliest_one`` answer.
    """

    cdef readonly Py_ssize_t n
    cdef readonly Py_ssize_t count
    cdef double **st
    cdef double **en
    cdef Py_ssize_t *cnt
    cdef Py_ssize_t *cap
    cdef double *e
    cdef double last_when

    def __cinit__(self, Py_ssize_t n):
        if n < 0:
            raise ValueError(f"NodeSpans: n is {n}, must be >= 0")
        self.n = n
        self.count = 0
        self.last_when = INFINITY
        cdef Py_ssize_t m = n if n > 0 else 1
        self.st = <double **>calloc(m, sizeof(double *))
        self.en = <double **>calloc(m, sizeof(double *))
        self.cnt = <Py_ssize_t *>calloc(m, sizeof(Py_ssize_t))
        self.cap = <Py_ssize_t *>calloc(m, sizeof(Py_ssize_t))
        self.e = <double *>calloc(m, sizeof(double))
        if not (self.st and self.en and self.cnt and self.cap and self.e):
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.st != NULL:
            for i in range(self.n):
                free(self.st[i])
        if self.en != NULL:
            for i in range(self.n):
                free(self.en[i])
        free(self.st)
        free(self.en)
        free(self.cnt)
        free(self.cap)
        free(self.e)

    cdef int _node(self, str fn, object node) except -1:
        cdef Py_ssize_t i = node
        if i < 0 or i >= self.n:
            raise ValueError(f"NodeSpans.{fn}: node {i} outside 0..{self.n - 1}")
        return <int>i

    def add(self, nodes, double start, double end):
        """Reserve each of ``nodes`` (node indices) for ``[start, end)``."""
        cdef Py_ssize_t i
        idx = [self._node("add", node) for node in nodes]  # all checked before any is added
        for i in idx:
            self._add_one(i, start, end)

    cdef inline double _push(self, Py_ssize_t i, double x, double limit) noexcept nogil:
        """The earliest time >= x at which node i is free of spans for ``limit`` seconds:
        a span that overlaps moves the start to its end; the first one starting after the
        moved window ends the walk (every later one starts later still)."""
        cdef Py_ssize_t j
        cdef double *s = self.st[i]
        cdef double *f = self.en[i]
        for j in range(self.cnt[i]):
            if s[j] >= x + limit:
                break
            if x < f[j]:
                x = f[j]
        return x

    cdef inline bint _overlaps(self, Py_ssize_t i, double when, double limit) noexcept nogil:
        cdef Py_ssize_t j
        cdef double *s = self.st[i]
        cdef double *f = self.en[i]
        for j in range(self.cnt[i]):
            if s[j] >= when + limit:
                return False
            if when < f[j]:
                return True
        return False

    def reserved(self):
        """Per node, whether it holds a span (numpy bool array)."""
        out = np.zeros(self.n, dtype=np.bool_)
        cdef uint8_t[::1] o = out.view(np.uint8)
        cdef Py_ssize_t i
        for i in range(self.n):
            o[i] = self.cnt[i] > 0
        return out

    def spans(self, node):
        """The spans of one node, ``[(start, end), ...]`` in start order (for tests)."""
        cdef Py_ssize_t i = self._node("spans", node)
        return [(self.st[i][j], self.en[i][j]) for j in range(self.cnt[i])]

    def push(self, nodes, starts, double limit):
        """For each of ``nodes``, the earliest time >= its start free of spans for
        ``limit`` seconds (numpy float64 array)."""
        cdef const int64_t[::1] nd = np.ascontiguousarray(nodes, dtype=np.int64)
        cdef const double[::1] s = np.ascontiguousarray(starts, dtype=np.float64)
        _exact("NodeSpans.push", "starts", s.shape[0], nd.shape[0], "one per node")
        out = np.empty(nd.shape[0], dtype=np.float64)
        cdef double[::1] o = out
        cdef Py_ssize_t j
        for j in range(nd.shape[0]):
            o[j] = self._push(self._node("push", nd[j]), s[j], limit)
        return out

    def blocked(self, double when, double limit):
        """Nodes with a span overlapping ``[when, when + limit)`` (numpy bool array)."""
        out = np.zeros(self.n, dtype=np.bool_)
        cdef uint8_t[::1] o = out.view(np.uint8)
        cdef Py_ssize_t i
        if self.count:
            for i in range(self.n):
                o[i] = self._overlaps(i, when, limit)
        return out

    def ends_after(self, double t):
        """Every span's end later than ``t`` (a list, in no particular order)."""
        cdef Py_ssize_t i, j
        return [self.en[i][j] for i in range(self.n) for j in range(self.cnt[i])
                if self.en[i][j] > t]

    cdef double _earliest_one(self, const double *raw, double limit, double t,
                              const int64_t *weight, int64_t mult, Py_ssize_t *best_out,
                              bint *blocked_out) noexcept nogil:
        """:meth:`earliest_one` on raw pointers (``raw`` and ``weight`` of ``n`` entries)."""
        cdef Py_ssize_t i, best = -1
        cdef double when = INFINITY, first
        cdef double *e = self.e
        cdef bint blocked_now = False
        cdef int64_t key, best_key = 0
        # The best node without a span; a node with spans can only do better if its own
        # earliest fit is no later: push those past their spans.
        for i in range(self.n):
            if self.cnt[i] == 0 and raw[i] < when:
                when = raw[i]
        first = when
        for i in range(self.n):
            if self.cnt[i] == 0:
                e[i] = raw[i]
            elif raw[i] <= first:
                e[i] = self._push(i, raw[i], limit)
                if e[i] < when:
                    when = e[i]
                if raw[i] == t and e[i] != t:
                    blocked_now = True
            else:
                e[i] = INFINITY
        if when < INFINITY:
            for i in range(self.n):
                if e[i] == when:
                    key = weight[i] * mult + i
                    if best < 0 or key < best_key:
                        best, best_key = i, key
        self.last_when = when
        best_out[0] = best
        blocked_out[0] = blocked_now and when == t
        return when

    cdef int _add_one(self, Py_ssize_t i, double start, double end) except -1:
        cdef Py_ssize_t at, c = self.cnt[i]
        cdef double *s
        cdef double *f
        if c == self.cap[i]:
            self.cap[i] = 8 if c == 0 else 2 * c
            s = <double *>realloc(self.st[i], self.cap[i] * sizeof(double))
            if s == NULL:
                raise MemoryError()
            self.st[i] = s
            f = <double *>realloc(self.en[i], self.cap[i] * sizeof(double))
            if f == NULL:
                raise MemoryError()
            self.en[i] = f
        s, f = self.st[i], self.en[i]
        at = c  # after every span starting at or before `start` (bisect_right)
        while at > 0 and s[at - 1] > start:
            s[at] = s[at - 1]
            f[at] = f[at - 1]
            at -= 1
        s[at] = start
        f[at] = end
        self.cnt[i] = c + 1
        self.count += 1
        return 0

    def earliest_one(self, const double[::1] raw, double limit, double t,
                     const int64_t[::1] weight, int64_t mult):
        """The earliest time one node holds a one-node shape for ``limit`` seconds clear
        of spans, ``raw`` being each node's earliest fit with spans aside (>= ``t``).

        Returns ``(when, node, blocked_now)``: ``when`` is ``inf`` where no node ever
        holds it; ``node`` is the one with the lowest ``weight * mult + index`` among those
        that hold it at ``when`` (-1 if none); ``blocked_now`` (only when ``when == t``):
        some node that fits now with spans aside is kept from it by a span. The nodes that
        hold it at ``when`` stay readable through :meth:`feasible_last`.
        """
        cdef str fn = "NodeSpans.earliest_one"
        _exact(fn, "raw", raw.shape[0], self.n, "one per node")
        _exact(fn, "weight", weight.shape[0], self.n, "one per node")
        cdef Py_ssize_t best = -1
        cdef bint blocked = False
        cdef double when = INFINITY
        if self.n > 0:
            with nogil:
                when = self._earliest_one(&raw[0], limit, t, &weight[0], mult, &best,
                                          &blocked)
        else:
            self.last_when = INFINITY
        return when, best, bool(blocked)

    def reserve_ones(self, const double[:, ::1] raws, const int64_t[::1] slot,
                     const int64_t[::1] sid, const double[::1] limit,
                     const int64_t[::1] mult, double[::1] hopeless,
                     const int64_t[::1] weight, double t, double horizon,
                     double[::1] when_out, int64_t[::1] node_out):
        """A backfill pass's run of one-node jobs whose node the weight alone chooses, in
        order: each gets :meth:`earliest_one` (its shape's earliest fits ``raws[slot[j]]``,
        spans aside; ``mult[j]`` its weight multiplier) and, when that is after ``t`` and
        within ``horizon``, a span on the chosen node for ``[when, when + limit[j])``.

        A job whose ``limit[j]`` is no shorter than ``hopeless[sid[j]]`` (its shape's
        shortest limit that found nothing), or that finds nothing within the horizon, gets
        ``when_out[j] = inf`` (``hopeless`` lowered to its limit); otherwise ``when_out[j]``
        and ``node_out[j]`` are its start and node. Stops before the first job that could
        start at ``t`` (the caller decides on which nodes): returns its index, or the
        number of jobs when every one was answered.

        Raises:
            ValueError: arrays of unequal lengths, a slot outside ``raws`` or a shape
                outside ``hopeless`` (nothing is reserved).
        """
        cdef str fn = "NodeSpans.reserve_ones"
        cdef Py_ssize_t m = slot.shape[0], j, best
        _exact(fn, "raws[0]", raws.shape[1], self.n, "one per node")
        _exact(fn, "weight", weight.shape[0], self.n, "one per node")
        for name, have in (("sid", sid.shape[0]), ("limit", limit.shape[0]),
                           ("mult", mult.shape[0]), ("when_out", when_out.shape[0]),
                           ("node_out", node_out.shape[0])):
            _exact(fn, name, have, m, "one per job")
        for j in range(m):
            _in_range(fn, "slot[]", slot[j], 0, raws.shape[0] - 1)
            _in_range(fn, "sid[]", sid[j], 0, hopeless.shape[0] - 1)
        cdef double when
        cdef bint blocked
        if self.n == 0:
            for j in range(m):
                when_out[j] = INFINITY
                node_out[j] = -1
            return m
        for j in range(m):
            node_out[j] = -1
            if limit[j] >= hopeless[sid[j]]:
                when_out[j] = INFINITY
                continue
            with nogil:
                when = self._earliest_one(&raws[slot[j], 0], limit[j], t, &weight[0],
                                          mult[j], &best, &blocked)
            if when > horizon or when == INFINITY:
                when_out[j] = INFINITY
                if limit[j] < hopeless[sid[j]]:
                    hopeless[sid[j]] = limit[j]
                continue
            if when == t:
                return j
            when_out[j] = when
            node_out[j] = best
            self._add_one(best, when, when + limit[j])
        return m

    def feasible_last(self):
        """The nodes that hold the shape of the last :meth:`earliest_one` at its answer."""
        out = np.zeros(self.n, dtype=np.bool_)
        cdef uint8_t[::1] o = out.view(np.uint8)
        cdef Py_ssize_t i
        if self.last_when < INFINITY:
            for i in range(self.n):
                o[i] = self.e[i] == self.last_when
        return out

    def earliest_multi(self, const double[::1] raw, Py_ssize_t k, double limit, double t,
                       double horizon):
        """The earliest candidate time (a node's earliest fit, or a span's end after
        ``t``), up to ``horizon``, at which ``k`` nodes fit with spans aside and are free
        of spans for ``limit`` seconds; ``inf`` if none."""
        cdef str fn = "NodeSpans.earliest_multi"
        _exact(fn, "raw", raw.shape[0], self.n, "one per node")
        cdef Py_ssize_t i, j, m = 0, have
        cdef double when, prev = -INFINITY
        cdef double answer = INFINITY
        cdef double *c = <double *>malloc((self.n + self.count + 1) * sizeof(double))
        if c == NULL:
            raise MemoryError()
        try:
            with nogil:
                for i in range(self.n):
                    if raw[i] < INFINITY:
                        c[m] = raw[i]
                        m += 1
                    for j in range(self.cnt[i]):
                        if self.en[i][j] > t:
                            c[m] = self.en[i][j]
                            m += 1
                qsort(c, m, sizeof(double), _cmp_double)
                for j in range(m):
                    when = c[j]
                    if j > 0 and when == prev:
                        continue
                    prev = when
                    if when > horizon:
                        break
                    have = 0
                    for i in range(self.n):
                        if raw[i] <= when and not self._overlaps(i, when, limit):
                            have += 1
                    if have >= k:
                        answer = when
                        break
        finally:
            free(c)
        return answer


cdef class Releases:
    """What the running jobs hold per node, each node's entries in the order of their
    planned ends: the earliest time one share of a shape fits on each node once the jobs
    ending by then have ended (the ``slurm`` backfill model's earliest fits, reservations
    aside). Kept in step with the running set (:meth:`add` on a start, :meth:`remove` on an
    end) instead of sorted again for every backfill pass.

    The rule (its numpy twin: ``hetslurm.simulate.slurm_backfill.ReleaseViewReference``):
    on node ``i``, free counts now plus the holdings of its entries in end order; the first
    entry after which the shape fits gives ``max(end, t)``; fitting now gives ``t``; never
    fitting gives ``inf``. An entry whose planned end is not after ``t`` (a zero time limit)
    releases at the earliest planned end after ``t`` of any entry, never at ``t``.
    """

    cdef readonly Py_ssize_t n
    cdef readonly Py_ssize_t count
    cdef double **end
    cdef int64_t **pos
    cdef int64_t **g
    cdef int64_t **c
    cdef int64_t **m
    cdef Py_ssize_t *cnt
    cdef Py_ssize_t *cap

    def __cinit__(self, Py_ssize_t n):
        if n < 0:
            raise ValueError(f"Releases: n is {n}, must be >= 0")
        self.n = n
        self.count = 0
        cdef Py_ssize_t k = n if n > 0 else 1
        self.end = <double **>calloc(k, sizeof(double *))
        self.pos = <int64_t **>calloc(k, sizeof(int64_t *))
        self.g = <int64_t **>calloc(k, sizeof(int64_t *))
        self.c = <int64_t **>calloc(k, sizeof(int64_t *))
        self.m = <int64_t **>calloc(k, sizeof(int64_t *))
        self.cnt = <Py_ssize_t *>calloc(k, sizeof(Py_ssize_t))
        self.cap = <Py_ssize_t *>calloc(k, sizeof(Py_ssize_t))
        if not (self.end and self.pos and self.g and self.c and self.m and self.cnt
                and self.cap):
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.n):
            if self.end != NULL:
                free(self.end[i])
            if self.pos != NULL:
                free(self.pos[i])
            if self.g != NULL:
                free(self.g[i])
            if self.c != NULL:
                free(self.c[i])
            if self.m != NULL:
                free(self.m[i])
        free(self.end)
        free(self.pos)
        free(self.g)
        free(self.c)
        free(self.m)
        free(self.cnt)
        free(self.cap)

    cdef int _grow(self, Py_ssize_t i) except -1:
        cdef Py_ssize_t k = 8 if self.cap[i] == 0 else 2 * self.cap[i]
        cdef void *p
        p = realloc(self.end[i], k * sizeof(double))
        if p == NULL:
            raise MemoryError()
        self.end[i] = <double *>p
        p = realloc(self.pos[i], k * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        self.pos[i] = <int64_t *>p
        p = realloc(self.g[i], k * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        self.g[i] = <int64_t *>p
        p = realloc(self.c[i], k * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        self.c[i] = <int64_t *>p
        p = realloc(self.m[i], k * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        self.m[i] = <int64_t *>p
        self.cap[i] = k
        return 0

    def add(self, int64_t job, const int64_t[::1] nodes, int64_t gpus, int64_t cores,
            int64_t mem, double end):
        """Job ``job`` holds ``gpus`` GPUs, ``cores`` cores and ``mem`` MiB on each of
        ``nodes`` until ``end`` (its planned end)."""
        cdef str fn = "Releases.add"
        cdef Py_ssize_t t, i, at
        for t in range(nodes.shape[0]):
            _in_range(fn, "nodes[]", nodes[t], 0, self.n - 1)
        for t in range(nodes.shape[0]):
            i = nodes[t]
            if self.cnt[i] == self.cap[i]:
                self._grow(i)
            at = self.cnt[i]  # after every entry ending at or before `end`
            while at > 0 and self.end[i][at - 1] > end:
                self.end[i][at] = self.end[i][at - 1]
                self.pos[i][at] = self.pos[i][at - 1]
                self.g[i][at] = self.g[i][at - 1]
                self.c[i][at] = self.c[i][at - 1]
                self.m[i][at] = self.m[i][at - 1]
                at -= 1
            self.end[i][at] = end
            self.pos[i][at] = job
            self.g[i][at] = gpus
            self.c[i][at] = cores
            self.m[i][at] = mem
            self.cnt[i] += 1
            self.count += 1

    def remove(self, int64_t job, const int64_t[::1] nodes):
        """Job ``job`` ended: its entries on ``nodes`` go.

        Raises:
            ValueError: a node outside the index, or one without an entry of ``job``
                (nothing is removed from it).
        """
        cdef str fn = "Releases.remove"
        cdef Py_ssize_t t, i, j, k
        for t in range(nodes.shape[0]):
            _in_range(fn, "nodes[]", nodes[t], 0, self.n - 1)
        for t in range(nodes.shape[0]):
            i = nodes[t]
            for j in range(self.cnt[i]):
                if self.pos[i][j] == job:
                    break
            else:
                raise ValueError(f"{fn}: job {job} holds nothing on node {i}")
            for k in range(j, self.cnt[i] - 1):
                self.end[i][k] = self.end[i][k + 1]
                self.pos[i][k] = self.pos[i][k + 1]
                self.g[i][k] = self.g[i][k + 1]
                self.c[i][k] = self.c[i][k + 1]
                self.m[i][k] = self.m[i][k + 1]
            self.cnt[i] -= 1
            self.count -= 1

    cdef double _next_end(self, double t) noexcept nogil:
        """The earliest planned end after ``t`` of any entry (``inf`` if none)."""
        cdef Py_ssize_t i, j
        cdef double best = INFINITY
        for i in range(self.n):
            for j in range(self.cnt[i]):
                if self.end[i][j] > t:
                    if self.end[i][j] < best:
                        best = self.end[i][j]
                    break  # sorted: the rest of the node ends later
        return best

    def earliest(self, const int64_t[::1] idx, int64_t gpus, int64_t cores, int64_t mem,
                 const int64_t[::1] gpu_cnt, const int64_t[::1] core_cnt,
                 const int64_t[::1] mem_free, double t, double[::1] out):
        """Per node, into ``out``: the earliest time one share (``gpus`` GPUs, ``cores``
        cores, ``mem`` MiB on one node; 0 GPUs or memory <= 0: not asked) fits there, given
        the free counts now; ``inf`` outside ``idx`` (the nodes that can ever hold it).

        Raises:
            ValueError: arrays of the wrong length or a node of ``idx`` outside the index.
        """
        cdef str fn = "Releases.earliest"
        _exact(fn, "gpu_cnt", gpu_cnt.shape[0], self.n, "one per node")
        _exact(fn, "core_cnt", core_cnt.shape[0], self.n, "one per node")
        _exact(fn, "mem_free", mem_free.shape[0], self.n, "one per node")
        _exact(fn, "out", out.shape[0], self.n, "one per node")
        cdef Py_ssize_t t_, i, j
        for t_ in range(idx.shape[0]):
            _in_range(fn, "idx[]", idx[t_], 0, self.n - 1)
        cdef int64_t fg, fc, fm
        cdef double nxt = -1.0, e
        with nogil:
            for i in range(self.n):
                out[i] = INFINITY
            for t_ in range(idx.shape[0]):
                i = idx[t_]
                fg, fc, fm = gpu_cnt[i], core_cnt[i], mem_free[i]
                if fc >= cores and (gpus == 0 or fg >= gpus) and (mem <= 0 or fm >= mem):
                    out[i] = t
                    continue
                for j in range(self.cnt[i]):
                    fg += self.g[i][j]
                    fc += self.c[i][j]
                    fm += self.m[i][j]
                    if fc >= cores and (gpus == 0 or fg >= gpus) and (mem <= 0 or fm >= mem):
                        e = self.end[i][j]
                        if e <= t:
                            if nxt < 0:
                                nxt = self._next_end(t)
                            e = nxt
                        out[i] = e
                        break

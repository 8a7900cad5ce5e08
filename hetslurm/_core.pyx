"""Placement kernels: the compiled core of hetslurm.placement.

Pure functions over contiguous arrays. They trust their inputs: shapes, dtypes and ranges are
checked once by ``hetslurm.placement.gpus``, which is the API to call. Compiler directives are
set in ``setup.py`` only (``HETSLURM_DEBUG_BUILD=1`` turns bounds checking on).

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

from libc.stdint cimport int32_t, int64_t, uint8_t

NO_FIT = -1
ISLAND_SHIFT = SCORE_ISLAND_SHIFT
LEFTOVER_SHIFT = SCORE_LEFTOVER_SHIFT
TERM_BITS = SCORE_TERM_BITS

# Number of per-GPU int32 scratch arrays GpuChooser slices out of one allocation.
cdef Py_ssize_t _N_SCRATCH = 16


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
    const flag_t[::1] free,
    const gid_t[::1] island,
    const gid_t[::1] numa,
    Py_ssize_t n,
    gid_t[::1] out,
):
    """Choose ``n`` GPUs in one node (policy and score in the module docstring).

    Trusts its inputs; call ``hetslurm.placement.gpus.choose_gpus`` instead, which validates.

    Args:
        free: shape (G,), uint8, C-contiguous; 1 = free, 0 = busy.
        island: shape (G,), int32 >= 0, C-contiguous; NVLink island id per GPU.
        numa: shape (G,), int32 >= 0, C-contiguous; NUMA domain id per GPU.
        n: GPUs wanted, 1 <= n <= 2**16.
        out: shape (>= n,), int32, C-contiguous, writable; receives the chosen node-local
            indices in ascending order. Untouched when the result is -1.

    Returns:
        int: the packed score (lower is better), or -1 when fewer than ``n`` GPUs are free.
    """
    cdef GpuChooser chooser = GpuChooser(free.shape[0])
    cdef score_t score
    with nogil:
        score = chooser.choose(free, island, numa, n, out)
    return score


def choose_gpus_batch(
    const int64_t[::1] offsets,
    const flag_t[::1] free,
    const gid_t[::1] island,
    const gid_t[::1] numa,
    Py_ssize_t n,
    score_t[::1] scores,
    gid_t[:, ::1] out,
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
    """
    cdef Py_ssize_t i, a, b, nodes = offsets.shape[0] - 1, widest = 0
    for i in range(nodes):
        if offsets[i + 1] - offsets[i] > widest:
            widest = offsets[i + 1] - offsets[i]
    cdef GpuChooser chooser = GpuChooser(widest)
    with nogil:
        for i in range(nodes):
            a = offsets[i]
            b = offsets[i + 1]
            scores[i] = chooser.choose(free[a:b], island[a:b], numa[a:b], n, out[i, :])

"""Numba kernels of substitution decompression (private; imported lazily): building the
level-sorted plan of an acyclic coloring, and solving it on the CPU."""

import numpy as np
from numba import njit


@njit(cache=True)
def _substitute(flat, step_pos, step_pos_t, step_src, dep_ptr, dep_pos, out):
    for k in range(step_pos.shape[0]):
        v = flat[step_src[k]]
        for d in range(dep_ptr[k], dep_ptr[k + 1]):
            v -= out[dep_pos[d]]
        out[step_pos[k]] = v
        out[step_pos_t[k]] = v
    return out


@njit(cache=True)
def _substitute_bounded(flat, step_pos, step_pos_t, step_src, dep_ptr, dep_pos, out, bound, eps, tol, loose):
    """:func:`_substitute`, with each entry's rounding bound (in units of eps, as
    :func:`rounding_excess` walks it) in ``bound``. Returns how many steps wrote an entry whose
    bound exceeds ``tol`` times its own magnitude (``eps * b > tol * |v|``; listed first in
    ``loose``) and the largest magnitude written. An entry within that is within it against the
    scale of either of its rows, which is at least its own."""
    nloose = 0
    top = 0.0
    for k in range(step_pos.shape[0]):
        v = flat[step_src[k]]
        b = 0.0
        for d in range(dep_ptr[k], dep_ptr[k + 1]):
            q = dep_pos[d]
            v -= out[q]
            b += bound[q]
        a = abs(v)
        b += a
        if top < a < np.inf:  # the finite largest: one inf entry must not lift the floor of every row
            top = a
        if eps * b > tol * a:
            loose[nloose] = k
            nloose += 1
        p, pt = step_pos[k], step_pos_t[k]
        out[p] = v
        out[pt] = v
        bound[p] = b
        bound[pt] = b
    return nloose, top


@njit(cache=True)
def _row_max(values, indptr, i):
    # the row's finite scale (an inf entry beside finite ones leaves them theirs)
    m = 0.0
    for p in range(indptr[i], indptr[i + 1]):
        a = abs(values[p])
        if m < a < np.inf:
            m = a
    return m


@njit(cache=True)
def _excess_of_loose(values, bound, indptr, indices, rows, step_pos, loose, nloose, top, eps, tol, floor_power):
    # the loose entries alone, each against the smaller of its two rows (at least the floor)
    floor = top * eps ** floor_power
    worst = 0.0
    for t in range(nloose):
        p = step_pos[loose[t]]
        scale = max(min(_row_max(values, indptr, rows[p]), _row_max(values, indptr, indices[p])), floor)
        if scale > 0.0:
            r = eps * bound[p] / (tol * scale)
            if r > worst:
                worst = r
    return worst


def _out(flat, plan):
    # a plan whose steps write every entry needs no zero fill (a tenth of the call at n = 10^5)
    return np.empty(plan.nnz, dtype=flat.dtype) if plan.writes_every_entry else np.zeros(plan.nnz, dtype=flat.dtype)


def substitute_numba(flat, plan):
    """Values in CSR order from the flat compressed buffer and a :class:`SubstitutionPlan`."""
    flat = np.ascontiguousarray(flat)
    return _substitute(flat, plan.step_pos, plan.step_pos_t, plan.step_src, plan.dep_ptr, plan.dep_pos,
                       _out(flat, plan))


def substitute_screened(flat, plan, indptr, indices, rows, eps, tol, floor_power):
    """:func:`substitute_numba` and, from the same walk, :func:`rounding_excess` of its values
    (``indptr``, ``indices``, ``rows``: the symmetric pattern's CSR arrays and the row of every
    entry), judged only at the entries whose bound exceeds ``tol`` times the entry itself: the
    rest cannot exceed it against their rows. 0 where there are none."""
    flat = np.ascontiguousarray(flat)
    out = _out(flat, plan)
    # entries no step writes are 0 and bound by 0 (the plan's zero fill)
    bound = np.empty(plan.nnz, dtype=np.float64) if plan.writes_every_entry else np.zeros(plan.nnz, dtype=np.float64)
    loose = np.empty(plan.step_pos.shape[0], dtype=np.int64)
    nloose, top = _substitute_bounded(flat, plan.step_pos, plan.step_pos_t, plan.step_src, plan.dep_ptr,
                                      plan.dep_pos, out, bound, eps, tol, loose)
    if nloose == 0:
        return out, 0.0
    return out, _excess_of_loose(out, bound, indptr, indices, rows, plan.step_pos, loose, nloose, top, eps, tol,
                                 floor_power)


@njit(cache=True)
def writes_every_entry(nnz, step_pos, step_pos_t):
    """Whether the steps write every one of ``nnz`` entries (positions outside raise)."""
    written = np.zeros(nnz, dtype=np.bool_)
    for k in range(step_pos.shape[0]):
        p, q = step_pos[k], step_pos_t[k]
        if p < 0 or p >= nnz or q < 0 or q >= nnz:
            raise ValueError("a substitution plan's steps point past its entries")
        written[p] = True
        written[q] = True
    for p in range(nnz):
        if not written[p]:
            return False
    return True


@njit(cache=True)
def build_substitution(ptr, idx, tpos, rows, color, perm, gstart, n, vd, queue):
    """Peel the leaves of every two-colored forest.

    ``perm``: the off-diagonal CSR positions sorted by (color pair, row); ``gstart``: the start
    of each color pair's segment in ``perm`` (length ngroups + 1). ``vd`` (``(n, 5)``, zeros) and
    ``queue`` (``n``) are scratch, of an integer type that holds every vertex and position (int32
    where they fit: half the memory to fault in).  Returns the steps
    (pos, pos_t, src) in creation order, which is a sequential order (every dependency of a step
    is written by an earlier step), their dependencies (CSR-like) and ``ok`` (False if some
    two-colored subgraph has a cycle). :func:`sort_steps_by_level` sorts them by level.
    """
    nnz = idx.shape[0]
    # diagonal steps first
    ndiag = 0
    for p in range(nnz):
        if rows[p] == idx[p]:
            ndiag += 1
    nedge = (nnz - ndiag) // 2
    nsteps = ndiag + nedge
    step_pos = np.empty(nsteps, dtype=np.int64)
    step_pos_t = np.empty(nsteps, dtype=np.int64)
    step_src = np.empty(nsteps, dtype=np.int64)
    dep_ptr = np.zeros(nsteps + 1, dtype=np.int64)
    dep_pos = np.empty(max(nnz - ndiag - nedge, 1) * 1, dtype=np.int64)
    ndep_cap = dep_pos.shape[0]
    ndep = 0
    k = 0
    for p in range(nnz):
        if rows[p] == idx[p]:
            i = rows[p]
            step_pos[k] = p
            step_pos_t[k] = p
            step_src[k] = color[i] * n + i
            dep_ptr[k + 1] = ndep
            k += 1
    # per-vertex scratch for the current group, packed in one row: degree, XOR of the neighbours,
    # XOR of their positions (the last neighbour and position once the degree is 1: XOR, unlike a
    # sum, stays within the index type), segment start and end in perm
    ok = True
    ngroups = gstart.shape[0] - 1
    for g in range(ngroups):
        a = gstart[g]
        b = gstart[g + 1]
        # vertex segments (perm is sorted by row inside the group)
        t = a
        while t < b:
            i = rows[perm[t]]
            u = t
            while u < b and rows[perm[u]] == i:
                u += 1
            vd[i, 3] = t
            vd[i, 4] = u
            vd[i, 0] = u - t
            s1 = 0
            s2 = 0
            for z in range(t, u):
                s1 ^= idx[perm[z]]
                s2 ^= perm[z]
            vd[i, 1] = s1
            vd[i, 2] = s2
            t = u
        # leaves
        qh = 0
        qt = 0
        t = a
        while t < b:
            i = rows[perm[t]]
            if vd[i, 0] == 1:
                queue[qt] = i
                qt += 1
            t = vd[i, 4]
        while qh < qt:
            i = queue[qh]
            qh += 1
            if vd[i, 0] != 1:
                continue
            j = vd[i, 1]
            p = vd[i, 2]
            # H[i, j] = B[c(j)][i] - sum of H[i, x] over i's other edges of this group (solved)
            step_pos[k] = p
            step_pos_t[k] = tpos[p]
            step_src[k] = color[j] * n + i
            for z in range(vd[i, 3], vd[i, 4]):
                d = perm[z]
                if d != p:
                    if ndep >= ndep_cap:
                        newcap = ndep_cap * 2 + 16
                        tmp = np.empty(newcap, dtype=np.int64)
                        tmp[:ndep] = dep_pos[:ndep]
                        dep_pos = tmp
                        ndep_cap = newcap
                    dep_pos[ndep] = d
                    ndep += 1
            dep_ptr[k + 1] = ndep
            k += 1
            vd[i, 0] = 0
            vd[j, 0] -= 1
            vd[j, 1] ^= i
            vd[j, 2] ^= tpos[p]
            if vd[j, 0] == 1:
                queue[qt] = j
                qt += 1
        # anything left means a cycle
        t = a
        while t < b:
            i = rows[perm[t]]
            if vd[i, 0] != 0:
                ok = False
                vd[i, 0] = 0
            t = vd[i, 4]
    if k != nsteps:
        ok = False
    return step_pos[:k], step_pos_t[:k], step_src[:k], dep_ptr[: k + 1], dep_pos[:ndep].copy(), ok


@njit(cache=True)
def group_by_pair(rows, idx, color, k, perm):
    """Off-diagonal positions stably counting-sorted by color pair (so (row, col) order is
    kept inside a pair), written into ``perm`` (scratch of at least as many elements as entries,
    of an integer type that holds every position); returns (perm over the off-diagonal
    positions, gstart, clash) over the non-empty pairs, ``clash`` True where two adjacent vertices
    share a color (then perm and gstart are empty)."""
    nnz = idx.shape[0]
    cnt = np.zeros(k * k + 1, dtype=np.int64)
    noff = 0
    for p in range(nnz):
        i = rows[p]
        j = idx[p]
        if i != j:
            a = color[i]
            b = color[j]
            if a == b:
                return perm[:0], np.zeros(1, dtype=np.int64), True
            key = a * k + b if a < b else b * k + a
            cnt[key + 1] += 1
            noff += 1
    for t in range(k * k):
        cnt[t + 1] += cnt[t]
    ng = 0
    for t in range(k * k):
        if cnt[t + 1] > cnt[t]:
            ng += 1
    gstart = np.empty(ng + 1, dtype=np.int64)
    g = 0
    for t in range(k * k):
        if cnt[t + 1] > cnt[t]:
            gstart[g] = cnt[t]
            g += 1
    gstart[ng] = noff
    nxt = cnt[:-1].copy()
    if perm.shape[0] < noff:
        raise ValueError("group_by_pair: perm is too short")
    for p in range(nnz):
        i = rows[p]
        j = idx[p]
        if i != j:
            a = color[i]
            b = color[j]
            key = a * k + b if a < b else b * k + a
            perm[nxt[key]] = p
            nxt[key] += 1
    return perm[:noff], gstart, False


@njit(cache=True)
def sort_steps_by_level(nnz, step_pos, step_pos_t, step_src, dep_ptr, dep_pos):
    """The steps of a sequential plan sorted by level, stably: a step's level is 1 + the deepest
    level of the steps that wrote its dependencies (0 without any). Returns ``(pos, pos_t, src,
    dep_ptr, dep_pos, dep_step, level_ptr)``."""
    ns = step_pos.shape[0]
    step_lvl = np.empty(ns, dtype=np.int64)
    lvl_pos = np.full(nnz, -1, dtype=np.int64)
    for s in range(ns):
        if not (0 <= step_pos[s] < nnz and 0 <= step_pos_t[s] < nnz and 0 <= dep_ptr[s] <= dep_ptr[s + 1]
                and dep_ptr[s + 1] <= dep_pos.shape[0]):
            raise ValueError("a substitution plan's steps point past its entries or dependencies")
        lv = 0
        for d in range(dep_ptr[s], dep_ptr[s + 1]):
            if not 0 <= dep_pos[d] < nnz:
                raise ValueError("a substitution plan's dependency points past its entries")
            if lvl_pos[dep_pos[d]] + 1 > lv:
                lv = lvl_pos[dep_pos[d]] + 1
        step_lvl[s] = lv
        lvl_pos[step_pos[s]] = lv
        lvl_pos[step_pos_t[s]] = lv
    nlev = 0
    for s in range(ns):
        if step_lvl[s] + 1 > nlev:
            nlev = step_lvl[s] + 1
    level_ptr = np.zeros(nlev + 1, dtype=np.int64)
    for s in range(ns):
        level_ptr[step_lvl[s] + 1] += 1
    for l in range(nlev):
        level_ptr[l + 1] += level_ptr[l]
    nxt = level_ptr[:-1].copy()
    where = np.empty(ns, dtype=np.int64)
    for s in range(ns):
        l = step_lvl[s]
        where[s] = nxt[l]
        nxt[l] += 1
    o_pos = np.empty(ns, dtype=np.int64)
    o_pos_t = np.empty(ns, dtype=np.int64)
    o_src = np.empty(ns, dtype=np.int64)
    o_ptr = np.zeros(ns + 1, dtype=np.int64)
    for s in range(ns):
        w = where[s]
        o_pos[w] = step_pos[s]
        o_pos_t[w] = step_pos_t[s]
        o_src[w] = step_src[s]
        o_ptr[w + 1] = dep_ptr[s + 1] - dep_ptr[s]
    for w in range(ns):
        o_ptr[w + 1] += o_ptr[w]
    nd = dep_pos.shape[0]
    o_dep = np.empty(nd, dtype=np.int64)
    o_step = np.empty(nd, dtype=np.int64)
    for s in range(ns):
        w = where[s]
        q = o_ptr[w]
        for d in range(dep_ptr[s], dep_ptr[s + 1]):
            o_dep[q] = dep_pos[d]
            o_step[q] = w
            q += 1
    return o_pos, o_pos_t, o_src, o_ptr, o_dep, o_step, level_ptr


@njit(cache=True)
def plan_error(nnz, size, step_pos, step_pos_t, step_src, dep_ptr, dep_pos, dep_step, level_ptr, leveled):
    """What is wrong with a plan built by hand (the kernels read it unchecked), or ``""``: the
    indices out of range, or a dependency not written before the step reading it (by an earlier
    step of a sequential plan, an earlier level of a leveled one). The arrays' lengths are checked
    by the caller."""
    ns = step_pos.shape[0]
    nd = dep_pos.shape[0]
    if dep_ptr[0] != 0 or dep_ptr[ns] != nd:
        return "dep_ptr must run from 0 to the number of dependencies"
    for k in range(ns):
        if dep_ptr[k + 1] < dep_ptr[k]:
            return "dep_ptr must not decrease"
        if not (0 <= step_pos[k] < nnz and 0 <= step_pos_t[k] < nnz):
            return "a step's position is outside the entries"
        if not 0 <= step_src[k] < size:
            return "a step reads outside the compressed buffer"
    for d in range(nd):
        if not 0 <= dep_pos[d] < nnz:
            return "a dependency is outside the entries"
    # when (in steps or levels) every entry is written: a dependency must be written before
    written = np.full(nnz, -1, dtype=np.int64)
    if leveled:
        nlev = level_ptr.shape[0] - 1
        if level_ptr[0] != 0 or level_ptr[nlev] != ns:
            return "level_ptr must run from 0 to the number of steps"
        for lv in range(nlev):
            if level_ptr[lv + 1] < level_ptr[lv]:
                return "level_ptr must not decrease"
        for lv in range(nlev):
            for k in range(level_ptr[lv], level_ptr[lv + 1]):
                for d in range(dep_ptr[k], dep_ptr[k + 1]):
                    if dep_step[d] != k:
                        return "dep_step must name the step each dependency belongs to"
                    w = written[dep_pos[d]]
                    if w < 0 or w >= lv:
                        return "a dependency is not written by an earlier level"
            for k in range(level_ptr[lv], level_ptr[lv + 1]):
                written[step_pos[k]] = lv
                written[step_pos_t[k]] = lv
    else:
        for k in range(ns):
            for d in range(dep_ptr[k], dep_ptr[k + 1]):
                if written[dep_pos[d]] < 0:
                    return "a dependency is not written by an earlier step"
            written[step_pos[k]] = k
            written[step_pos_t[k]] = k
    return ""


@njit(cache=True)
def rounding_excess(values, indptr, indices, rows, step_pos, step_pos_t, dep_ptr, dep_pos, eps, tol, floor_power):
    """The largest ratio, over the stored entries (``values``, in the CSR order of a symmetric
    pattern: ``indptr``, ``indices`` and the row of every entry), of a bound on the rounding
    substitution accumulated in an entry to ``tol`` times the scale of the smaller of its two
    rows (an entry is as much the small row's as the large one's; a row's scale is its largest
    magnitude, at least ``eps ** floor_power`` of the largest of all), where some entry's bound
    exceeds ``tol`` times its own magnitude; 0 where none does (then none can exceed it against
    its rows). The bound, in units of ``eps``: the entry's own magnitude plus the bounds of the
    entries subtracted from it (each step ``v = b - sum(deps)`` rounds ``|b| <= |v| + sum|deps|``).
    Scales are those of the finite entries; an entry that is not finite is the probe's to judge."""
    bound = np.zeros(values.shape[0], dtype=np.float64)
    loose = np.empty(step_pos.shape[0], dtype=np.int64)
    nloose = 0
    top = 0.0
    for k in range(step_pos.shape[0]):
        p = step_pos[k]
        a = abs(values[p])
        b = a
        for d in range(dep_ptr[k], dep_ptr[k + 1]):
            b += bound[dep_pos[d]]
        if top < a < np.inf:
            top = a
        if eps * b > tol * a:
            loose[nloose] = k
            nloose += 1
        bound[p] = b
        bound[step_pos_t[k]] = b
    if nloose == 0:
        return 0.0
    return _excess_of_loose(values, bound, indptr, indices, rows, step_pos, loose, nloose, top, eps, tol, floor_power)

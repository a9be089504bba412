"""The Python spec of the GPU sampler's random stream (mgg.testing.sample_reference) is a uniform
sampler without replacement (the GPU tests check the kernel against it bit for bit)."""
import numpy as np

from mgg.testing.graphs import random_csr
from mgg.testing.sample_reference import floyd_sample_reference, splitmix64


def test_splitmix64_known_values():
    # SplitMix64 stream from state 0: the published first outputs
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_reference_samples_distinct_edges_of_the_row():
    indptr, indices = random_csr(400, 9000, seed=1)
    seeds = np.arange(0, 400, 3)
    for fanout in (1, 7, 40, -1):
        ptr, nbr = floyd_sample_reference(indptr, indices, seeds, fanout, seed=11)
        for i, s in enumerate(seeds):
            row = indices[indptr[s]:indptr[s + 1]]
            got = nbr[ptr[i]:ptr[i + 1]]
            assert len(got) == (len(row) if fanout < 0 else min(len(row), fanout))
            vals, cnt = np.unique(row, return_counts=True)
            gv, gc = np.unique(got, return_counts=True)
            assert np.all(np.isin(gv, vals)) and np.all(gc <= cnt[np.searchsorted(vals, gv)])


def test_reference_is_uniform_on_a_star():
    deg, k, reps = 30, 6, 3000
    indptr = np.array([0, deg], dtype=np.int64)
    indices = np.arange(deg, dtype=np.int64)
    _, nbr = floyd_sample_reference(indptr, indices, np.zeros(reps, np.int64), k, seed=5)
    rows = nbr.reshape(reps, k)
    assert all(len(set(r)) == k for r in rows)
    counts = np.bincount(nbr, minlength=deg)
    expected = reps * k / deg
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 70.0, chi2  # 29 dof: mean 29, p(chi2 > 70) ~ 3e-5

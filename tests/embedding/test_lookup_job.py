"""`mgg.embedding.lookup_job`: a request looked up in parts of bounded work (bags split across
parts included) gives what one lookup of the whole request gives, in every mode."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mgg.embedding.lookup_job import LookupJob
from mgg.embedding.lookup_request import LookupRequest
from mgg.embedding.validate import check_bag_input
from mgg.testing.serve import bag_reference


def job_of(W, idx, off, mode, psw=None) -> LookupJob:
    bag = check_bag_input(idx, off, psw, num_embeddings=W.shape[0], mode=mode, include_last_offset=False)
    return LookupJob(LookupRequest(0, "t", W.shape[1], bag), lambda j: None)


def run_in_parts(job: LookupJob, W: np.ndarray, mode: str, units: int) -> tuple[np.ndarray, int]:
    """Look the job up part by part (each part pooled by torch over its ids only); the parts' count."""
    table = torch.from_numpy(W)
    parts = 0
    while not job.done:
        p = job.next_part(units)
        assert p.u1 - p.u <= units and p.e - p.c <= units and (p.e > p.c or p.u1 > p.u)
        bag = job.req.bag
        psw = None if bag.per_sample_weights is None else bag.per_sample_weights[p.u: p.u1]
        off = torch.from_numpy(np.append(p.local_offsets(), p.u1 - p.u))
        rows = F.embedding_bag(bag.indices[p.u: p.u1], table, off, mode=mode, per_sample_weights=psw,
                               include_last_offset=True).numpy()
        job.take(p, rows, mode)
        parts += 1
    return job.out, parts


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("units", [1, 2, 3, 7, 64, 10_000])
def test_parts_equal_the_whole_lookup(mode, units):
    rng = np.random.default_rng(units)
    W = rng.standard_normal((50, 6)).astype(np.float32)
    sizes = rng.choice([0, 0, 1, 2, 5, 40, 300], 60)  # empty bags, and bags larger than a part
    idx = rng.integers(0, 50, int(sizes.sum()))
    off = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    psw = rng.random(idx.size).astype(np.float32) if mode == "sum" else None
    out, parts = run_in_parts(job_of(W, idx, off, mode, psw), W, mode, units)
    np.testing.assert_allclose(out, bag_reference(W, idx, off, mode, psw), rtol=1e-4, atol=1e-4)
    if units < 100:
        assert parts >= idx.size // units  # really in parts


def test_one_huge_bag_and_only_empty_bags():
    rng = np.random.default_rng(1)
    W = rng.standard_normal((30, 4)).astype(np.float32)
    idx = rng.integers(0, 30, 10_000)
    for mode in ("sum", "mean", "max"):
        out, parts = run_in_parts(job_of(W, idx, [0], mode), W, mode, 128)
        assert parts == -(-idx.size // 128)
        np.testing.assert_allclose(out, bag_reference(W, idx, [0], mode), rtol=1e-4, atol=1e-4)
    out, parts = run_in_parts(job_of(W, np.zeros(0, np.int64), np.zeros(500, np.int64), "sum"), W, "sum", 64)
    assert parts == 8 and out.shape == (500, 4) and not out.any()

"""bench/sampled.py's store-gather floor: the rate and the floor from an epoch's byte counts."""
import math

import pytest

from bench.sampled import gather_against_floor, tier_of


def test_the_floor_is_the_slower_of_hbm_and_nvlink():
    bw = {"hbm_GBps": 4000.0, "nvlink_GBps": 400.0}
    # 4 ranks, 40 GB fetched of which 30 GB remote: a rank 10 GB, 7.5 GB of it over NVLink
    r = {"bytes_fetched": 40e9, "bytes_remote": 30e9, "gather_gpu_ms": 50.0}
    got = gather_against_floor(r, bw, 4)
    hbm_s, link_s = (2 * 10e9 - 7.5e9) / 4000e9, 7.5e9 / 400e9  # 3.1 ms and 18.8 ms
    assert got["gather_floor_ms"] == pytest.approx(max(hbm_s, link_s) * 1e3)
    assert got["gather_GBps"] == pytest.approx(10e9 / 0.05 / 1e9)
    assert got["gather_over_floor"] == pytest.approx(0.05 / link_s)


def test_one_rank_reads_only_its_memory():
    got = gather_against_floor({"bytes_fetched": 8e9, "bytes_remote": 0, "gather_gpu_ms": 10.0},
                               {"hbm_GBps": 4000.0}, 1)
    assert got["gather_floor_ms"] == pytest.approx(2 * 8e9 / 4000e9 * 1e3)
    assert math.isclose(got["gather_over_floor"], 10.0 / got["gather_floor_ms"])


def test_run_names_give_their_tier():
    assert [tier_of(r) for r in ("store", "store+reorder", "host+noprefetch")] == ["store", "store", "host"]

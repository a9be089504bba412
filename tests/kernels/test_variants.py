"""The kernel variant registry: the tuner's feasibility equals the launcher's, one padded_dim,
and `auto` on a rank without remote work."""
from __future__ import annotations

import ast
import itertools

import numpy as np
import pytest

from mgg.kernels import gpu
from mgg.kernels.variants import (DEFAULT_VARIANT, get_variant, plan_variant_names, tuned_variant_names,
                                  variant_names)
from mgg.runtime import partition_ranges
from mgg.runtime.layout import padded_dim
from mgg.runtime.plan import PlanParams, build_plan
from mgg.tuning.model import DeviceLimits, TuneConfig, estimate, feasible

from mgg.testing.graphs import random_csr
from mgg.testing.paths import ROOT

H100 = DeviceLimits(num_sms=132, smem_per_block_optin=232448, smem_per_sm=233472,
                    max_threads_per_block=1024, max_threads_per_sm=2048, name="test-h100")


def _plan(params: PlanParams, world: int = 2, rank: int = 0):
    """Rank `rank`'s plan of a random graph split over `world` ranks (remote partitions when world > 1)."""
    indptr, indices = random_csr(300, 4000, seed=3)
    b = partition_ranges(indptr, world)
    a, e = int(indptr[b[rank]]), int(indptr[b[rank + 1]])
    w = np.ones(e - a, np.float32)
    return build_plan(indptr[b[rank]: b[rank + 1] + 1] - a, indices[a:e], w, None, b, rank, params)


def _launcher_accepts(plan, variant: str, dim: int, limits: DeviceLimits) -> bool:
    """What GPUExecutor does before a launch: ask the registry's bytes, refuse above the limit."""
    smem = gpu.launch_smem_bytes(plan, variant, padded_dim(dim))
    try:
        gpu.check_shared_memory(variant, smem, limits.smem_per_block_optin, plan)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("variant", variant_names())
def test_tuner_feasibility_equals_launcher(variant):
    """Over a grid of ps / ps_inter / wpb / dim, the tuner allows exactly what the launcher runs."""
    disagree = []
    for ps, ps_inter, wpb in itertools.product((1, 4, 16, 32, 64), (None, 8, 128), (1, 2, 4, 8, 16, 32)):
        plan = _plan(PlanParams(ps, 2, wpb, ps_inter))
        assert len(plan.remote_parts) > 0
        for dim in (0, 1, 16, 64, 128, 130, 256, 512, 1024):
            tuner = feasible(TuneConfig(ps, 2, wpb, variant, ps_inter), dim, H100)
            launcher = _launcher_accepts(plan, variant, dim, H100)
            if tuner != launcher:
                disagree.append((ps, ps_inter, wpb, dim, tuner, launcher))
    assert not disagree, f"{variant}: (ps, ps_inter, wpb, dim, tuner, launcher) disagree at {disagree[:5]}"


def test_pipelined_ps32_wpb16_d128_is_refused_by_both():
    """The tuner and the kernel agree on 262,144 B (a shared-memory formula of 18,432 B was wrong)."""
    plan = _plan(PlanParams(32, 4, 16))
    e = estimate(TuneConfig(32, 4, 16, "pipelined"), 128, H100)
    assert e.smem == 16 * 32 * 128 * 4 == 262144
    assert not e.feasible and not _launcher_accepts(plan, "pipelined", 128, H100)
    assert estimate(TuneConfig(32, 4, 16, "paper"), 128, H100).smem == 32 * 16 * 4 + 2 * 16 * 128 * 4


def test_no_remote_partition_no_stage():
    """Without remote partitions the staged kernels launch with no shared memory (P = 1)."""
    plan = _plan(PlanParams(32, 4, 16), world=1)
    assert len(plan.remote_parts) == 0
    for v in ("pipelined", "pipelined_2pass", "paper", "ptr", "halo"):
        assert gpu.launch_smem_bytes(plan, v, 128) == 0
    assert gpu.launch_smem_bytes(plan, "nonpipelined", 128) == 16 * 32 * 128 * 4  # split kernel: always


def test_auto_runs_the_local_kernel_without_remote_work():
    assert gpu.choose_variant(_plan(PlanParams(), world=1)) == "csr_rows"
    assert get_variant("csr_rows").local_only and get_variant("csr_rows").executor == "csr"
    with_remote = _plan(PlanParams(), world=2)
    assert with_remote.num_remote_edges > 0
    reuse = with_remote.num_remote_edges / with_remote.halo_size
    assert gpu.choose_variant(with_remote) == ("halo_csr" if reuse >= gpu.HALO_MIN_REUSE else "ptr")
    assert gpu.choose_variant(with_remote, "bf16") == "halo_csr"  # ptr has no 16-bit kernels
    assert get_variant("halo_csr").executor == "halo_csr" and not get_variant("halo_csr").local_only


def test_registry_lists():
    names = variant_names()
    assert len(set(names)) == len(names) and "auto" not in names
    assert gpu.VARIANTS == plan_variant_names() == tuple(n for n in names if get_variant(n).executor == "plan")
    assert "csr_rows" in names and "csr_rows" not in gpu.VARIANTS and "halo_csr" not in gpu.VARIANTS
    assert set(tuned_variant_names()) == {"pipelined", "ptr", "halo", "halo_csr"}
    assert DEFAULT_VARIANT in names
    with pytest.raises(ValueError, match="unknown GPU kernel variant 'nope'"):
        get_variant("nope")


def test_one_padded_dim():
    assert [padded_dim(d) for d in (0, 1, 4, 5, 130)] == [4, 4, 4, 8, 132]
    from mgg.runtime import nvshmem_store
    from mgg.tuning import model

    assert nvshmem_store.padded_dim is padded_dim and model.padded_dim is padded_dim
    root = ROOT / "mgg"
    defs = [str(p.relative_to(root)) for p in root.rglob("*.py")
            for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.FunctionDef) and n.name == "padded_dim"]
    assert defs == ["runtime/layout.py"]

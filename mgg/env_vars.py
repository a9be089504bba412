"""Every MGG_* environment variable that mgg, its launch scripts, its benchmarks and its tests read,
with its default and meaning: the one list. `python -m mgg.train --help` prints the ones a run
reads (`run_env_help`), docs/configuration.md tabulates them all, and tests/project/test_env_vars.py
checks that every name the source reads is here and in that table. Importing it is cheap.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EnvVar", "ENV_VARS", "SCOPES", "env_var", "run_env_help"]


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: `scope` says who reads it (a key of SCOPES)."""

    name: str
    default: str
    meaning: str
    scope: str


#: who reads a variable: scope -> its heading in docs/configuration.md
SCOPES = {"run": "a run (mgg.train and the other entry points)", "launch": "the launch scripts (launch/)",
          "bench": "the benchmarks (bench/)", "tests": "the tests (tests/)"}

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("MGG_RANKS_PER_NODE", "ranks that share memory", "group ranks into nodes of K ranks: [0, K), [K, 2K), "
           "... (--ranks-per-node K overrides it; docs/multinode.md)", "run"),
    EnvVar("MGG_KERNEL_CACHE", "~/.cache/mgg/kernels", "folder of the compiled GPU kernels (docs/kernels.md)", "run"),
    EnvVar("MGG_CUDA_ARCH", "the device's", "GPU architecture the kernels are built for, e.g. sm_90", "run"),
    EnvVar("MGG_KERNEL_BUILD", "nvcc", "how kernels that call NVSHMEM are compiled: nvcc, nvrtc (NVRTC + "
           "nvJitLink) or auto (nvrtc, else nvcc)", "run"),
    EnvVar("MGG_BUILD_JOBS", "one a kernel module, at most the usable CPUs", "parallel kernel builds", "run"),
    EnvVar("MGG_TALL_GEMM", "1", "0: the models' float32 matrix products on cuBLAS instead of mgg's "
           "tall-skinny GEMM kernels (docs/kernels.md)", "run"),
    EnvVar("MGG_GAT_STRATEGY", "by degree (mgg.graph.adaptive)", "node or edge: force GAT's aggregation "
           "strategy (docs/gat.md)", "run"),
    EnvVar("MGG_MEMORY_AVAILABLE", "MemAvailable, capped by the cgroup", "bytes of host memory the memory "
           "check counts on", "run"),
    EnvVar("MGG_FAULT_INJECT", "unset", "RANK:EPOCH[:KIND]: rank RANK fails in epoch EPOCH (KIND raise, exit, "
           "kill, sigterm, sigint or hang; a test hook, docs/multinode.md)", "run"),
    EnvVar("MGG_SIGUSR2_IS_SIGTERM", "unset", "1: SIGUSR2 stops a run as SIGTERM does (set by "
           "launch/mpirun.sh)", "run"),
    EnvVar("MGG_SERVE_TOKEN", "unset", "mgg.serve's bearer token, as --auth-token (docs/embedding.md)", "run"),
    EnvVar("MGG_ROOT", "$SLURM_SUBMIT_DIR, else the current folder", "the mgg checkout launch/slurm.sbatch "
           "runs from", "launch"),
    EnvVar("MGG_CHECKPOINT_DIR", "checkpoints/<job name>-<job id> in MGG_ROOT", "launch/slurm.sbatch's "
           "--checkpoint-dir", "launch"),
    EnvVar("MGG_CHECKPOINT_EVERY", "10", "launch/slurm.sbatch's --checkpoint-every", "launch"),
    EnvVar("MGG_LAUNCHER", "srun", "how launch/slurm.sbatch starts the ranks: srun or mpirun", "launch"),
    EnvVar("MGG_SKIP_DOCTOR", "0", "1: launch/slurm.sbatch skips its python -m mgg.doctor check", "launch"),
    EnvVar("MGG_GPUS_PER_NODE", "$SLURM_GPUS_ON_NODE, else $SLURM_GPUS_PER_NODE", "ranks per node "
           "launch/srun.sh starts (one a GPU)", "launch"),
    EnvVar("MGG_MPIRUN_ARGS", "none", "extra mpirun arguments of launch/mpirun.sh and launch/srun.sh", "launch"),
    EnvVar("MGG_SRUN_ARGS", "none", "extra srun arguments of launch/srun.sh", "launch"),
    EnvVar("MGG_BENCH_CACHE", "/tmp/mgg-graphs (bench/overlap.py: /tmp/mgg-bench)", "folder of the graphs the "
           "benchmarks generate, reused between runs", "bench"),
    EnvVar("MGG_BENCH_DATA", "/tmp/mgg-bench-data", "bench/e2e.py's folder of dataset files", "bench"),
    EnvVar("MGG_BENCH_DRY", "0", "1 (bench/run.sh --dry-run): bench/device_env.sh installs and probes "
           "nothing", "bench"),
    EnvVar("MGG_TEST_TIMEOUT", "600", "seconds a test may run under tests/run_all.sh (docs/testing.md)", "tests"),
    EnvVar("MGG_TEST_FAILURE_LOG", "unset", "PATH: each failing test's report is appended to PATH "
           "(PATH.rankR under mpirun)", "tests"),
    EnvVar("MGG_TEST_ABORT_ON_FAILURE", "0", "1: under a multi-rank mpirun, the first failing test aborts "
           "every rank", "tests"),
    EnvVar("MGG_FUZZ_EXAMPLES", "0 (60 fixed examples)", "N: the bad-input fuzz tests run N random "
           "examples", "tests"),
    EnvVar("MGG_TEST_NVCC", "unset", "1: compile-check the GAT kernels with nvcc (needs NVSHMEM_HOME)", "tests"),
)


def env_var(name: str) -> EnvVar:
    """The entry of `name` (KeyError when it is not listed)."""
    for v in ENV_VARS:
        if v.name == name:
            return v
    raise KeyError(name)


def run_env_help() -> str:
    """The environment variables a run reads, for the epilog of a command's --help."""
    import textwrap

    lines = ["environment variables (with those of the launch scripts, benchmarks and tests: docs/configuration.md):"]
    for v in ENV_VARS:
        if v.scope == "run":
            lines.append(textwrap.fill(f"{v.name}: {v.meaning} (default: {v.default})", width=100,
                                       initial_indent="  ", subsequent_indent="      "))
    return "\n".join(lines)

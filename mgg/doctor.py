"""`python -m mgg.doctor`: what to know before a long job, and whether this setup is usable.

Run it exactly as the job will run (`mpirun -np P python -m mgg.doctor`, `srun ... python -m
mgg.doctor`, or alone). Every rank gathers facts about itself (host, GPUs, versions, NVSHMEM),
they are collected on rank 0, and rank 0 prints one report: ranks and nodes, GPUs per node and
their links (NVLink/PCIe from `nvidia-smi topo -m`, else CUDA peer access), the MPI library, an
MPI RMA window test (the CPU path's one-sided reads), NVSHMEM, torch and CUDA. Each problem gets
a line `PROBLEM: ...` (the job would fail or be wrong), each doubtful setting `WARNING: ...`.
Exit code 0 when usable, 1 otherwise, on every rank. Collective-safe: every rank takes the same
collective steps, and a watchdog (`--timeout`) turns a stuck one into an error.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from typing import Any, Sequence

from .apps.common_settings import backend_setting, ranks_per_node_setting
from .apps.flag_spec import Flag, add_flags, parse_settings, setting

__all__ = ["main", "build_parser", "DoctorSettings", "parse_topo", "summarize_links", "local_facts", "analyse"]

NVSHMEM_DISTS = ("nvshmem4py-cu13", "nvshmem4py-cu12", "nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12")
ENV_KEYS = ("NVSHMEM_BOOTSTRAP", "NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE", "NVSHMEM_SYMMETRIC_SIZE",
            "NVSHMEM_REMOTE_TRANSPORT", "NVSHMEM_IB_ENABLE_IBGDA", "CUDA_VISIBLE_DEVICES",
            "OMP_NUM_THREADS", "MGG_RANKS_PER_NODE", "SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_NNODES")
_LAUNCH_SIZE_KEYS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS")


# -- GPU links ----------------------------------------------------------------------------------
def parse_topo(text: str) -> dict[tuple[int, int], str]:
    """{(i, j): link} for every GPU pair i < j of an `nvidia-smi topo -m` matrix.

    Links: X (self), NV<n> (n NVLinks), PIX/PXB (PCIe switch), PHB (PCIe host bridge), NODE
    (across PCIe host bridges in a NUMA node), SYS (across NUMA nodes / SMP interconnect).
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # nvidia-smi underlines the header on a terminal
    rows = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not rows:
        return {}
    header = rows[0].split()
    gpu_cols = [k for k, h in enumerate(header) if re.fullmatch(r"GPU\d+", h)]
    links: dict[tuple[int, int], str] = {}
    for ln in rows[1:]:
        toks = ln.split()
        if not toks or not re.fullmatch(r"GPU\d+", toks[0]):
            continue
        i = int(toks[0][3:])
        cells = toks[1:]
        for k in gpu_cols:
            if k < len(cells):
                j = int(header[k][3:])
                if i < j:
                    links[(i, j)] = cells[k]
    return links


def summarize_links(links: dict[tuple[int, int], str]) -> str:
    """One line: e.g. 'NVLink between all 4 GPU pairs (NV18)' or 'PCIe only (PHB 2, SYS 4 pairs)'."""
    if not links:
        return "single GPU (no peer links)"
    kinds: dict[str, int] = {}
    for v in links.values():
        kinds[v] = kinds.get(v, 0) + 1
    nv = {k: n for k, n in kinds.items() if k.startswith("NV")}
    other = {k: n for k, n in kinds.items() if not k.startswith("NV")}
    detail = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    if not other:
        return f"NVLink between all {len(links)} GPU pairs ({detail})"
    if not nv:
        return f"PCIe/system links only, no NVLink ({detail} pairs)"
    return f"mixed: NVLink on {sum(nv.values())} of {len(links)} GPU pairs ({detail})"


def _gpu_links(n_gpus: int) -> tuple[str, str]:
    """(summary, source) of this node's GPU links."""
    if n_gpus <= 1:
        return summarize_links({}), "-"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=20)
            links = parse_topo(out.stdout) if out.returncode == 0 else {}
            if links:
                return summarize_links(links), "nvidia-smi topo -m"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch

        pairs = [(i, j) for i in range(n_gpus) for j in range(i + 1, n_gpus)]
        peer = {p: ("P2P" if torch.cuda.can_device_access_peer(*p) else "noP2P") for p in pairs}
        ok = sum(v == "P2P" for v in peer.values())
        return f"CUDA peer access on {ok} of {len(pairs)} GPU pairs (link type unknown)", "torch.cuda"
    except Exception as e:  # noqa: BLE001 - a report, not a crash
        return f"unknown ({type(e).__name__}: {e})", "-"


# -- per-rank facts -----------------------------------------------------------------------------
def _nvshmem_status() -> dict:
    from importlib import metadata

    st: dict[str, Any] = {"importable": False, "version": None, "dist": None, "error": None}
    for dist in NVSHMEM_DISTS:
        try:
            st["version"], st["dist"] = metadata.version(dist), dist
            break
        except metadata.PackageNotFoundError:
            continue
    try:
        import nvshmem  # noqa: F401
        import nvshmem.core  # noqa: F401

        st["importable"] = True
        st["version"] = st["version"] or getattr(nvshmem, "__version__", None)
    except Exception as e:  # noqa: BLE001 - ImportError, or a missing libnvshmem / driver
        st["error"] = f"{type(e).__name__}: {e}"
    return st


def local_facts(comm) -> dict:
    """Facts about this rank (no collectives; never raises)."""
    facts: dict[str, Any] = {"rank": comm.rank, "host": socket.gethostname(), "pid": os.getpid(),
                             "python": platform.python_version(), "problems": []}
    from .version import version

    facts["mgg"] = version()
    facts["env"] = {k: os.environ[k] for k in ENV_KEYS if k in os.environ}
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
        facts["cuda_available"] = bool(torch.cuda.is_available())
        n = torch.cuda.device_count() if facts["cuda_available"] else 0
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(n)]
        if n:  # the physical GPU this rank would use (mgg.runtime.gpu_assignment)
            from .runtime.gpu_assignment import probe_local_gpu

            facts["gpu_probe"] = dataclasses.asdict(probe_local_gpu(comm.rank, comm.local_rank))
    except Exception as e:  # noqa: BLE001
        facts.update(torch=None, torch_cuda=None, cuda_available=False, gpus=[])
        facts["problems"].append(f"torch does not import on rank {comm.rank} ({facts['host']}): {e}")
    facts["nvshmem"] = _nvshmem_status() if facts["cuda_available"] else {
        "importable": False, "version": None, "dist": None, "error": "no GPU"}
    if facts["nvshmem"]["error"] == "no GPU":
        try:
            from importlib import metadata

            for dist in NVSHMEM_DISTS:
                try:
                    facts["nvshmem"].update(version=metadata.version(dist), dist=dist)
                    break
                except metadata.PackageNotFoundError:
                    continue
        except Exception:  # noqa: BLE001
            pass
    if comm.comm is not None:
        from mpi4py import MPI

        lib = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
        facts["mpi_library"] = lib.split(", package:")[0]
        facts["mpi_standard"] = "%d.%d" % MPI.Get_version()
        facts["mpi4py"] = __import__("mpi4py").__version__
    else:
        facts["mpi_library"] = facts["mpi_standard"] = facts["mpi4py"] = None
    facts["launch_size"] = next((int(os.environ[k]) for k in _LAUNCH_SIZE_KEYS
                                 if os.environ.get(k, "").isdigit()), None)
    return facts


def _rma_test(comm) -> tuple[bool, str]:
    """Collective: each rank writes a pattern into an MPI window (mgg's MPIStore) and reads its
    right neighbour's rows with a one-sided get. Returns (ok, detail) on this rank."""
    if comm.comm is None:
        return True, "skipped (no MPI)"
    import numpy as np
    import torch

    from .runtime.store import MPIStore

    arr = None
    try:
        arr = MPIStore(comm).allocate(4, 3, torch.float32)
        arr.local.copy_(torch.arange(12, dtype=torch.float32).reshape(4, 3) + 100 * comm.rank)
        arr.publish()
        peer = (comm.rank + 1) % comm.size
        got = arr.get_rows(peer, np.array([3, 0, 2])).numpy()
        want = (np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * peer)[[3, 0, 2]]
        arr.release()
        ok = bool(np.array_equal(got, want))
        return ok, (f"window get from rank {peer} ok" if ok else f"window get from rank {peer} returned "
                    f"wrong data {got.ravel()[:4]}...")
    except Exception as e:  # noqa: BLE001 - reported; the peers may then wait -> watchdog
        return False, f"{type(e).__name__}: {e}"
    finally:
        if arr is not None:
            try:
                arr.free()
            except Exception:  # noqa: BLE001
                pass


# -- analysis -----------------------------------------------------------------------------------
def analyse(facts: list[dict], node_of: list[int], rma: list[tuple[bool, str]], backend: str,
            size: int) -> tuple[list[str], list[str], list[str]]:
    """(report lines, problems, warnings) from every rank's facts. Pure: tested directly."""
    lines: list[str] = []
    problems: list[str] = [p for f in facts for p in f.get("problems", [])]
    warnings: list[str] = []
    nodes = sorted(set(node_of))
    f0 = facts[0]
    lines.append(f"mgg {f0['mgg']}  python {f0['python']}  torch {f0.get('torch')} "
                 f"(CUDA {f0.get('torch_cuda') or 'none'})")
    lines.append(f"ranks: {size}   nodes: {len(nodes)}")
    for nd in nodes:
        ranks = [r for r in range(size) if node_of[r] == nd]
        hosts = sorted({facts[r]["host"] for r in ranks})
        f = facts[ranks[0]]
        gpus = f.get("gpus") or []
        desc = f"{len(gpus)} x {gpus[0]}" if gpus and len(set(gpus)) == 1 else (", ".join(gpus) or "no GPU")
        lines.append(f"  node {nd} ({', '.join(hosts)}): ranks {_ranges(ranks)}; GPUs: {desc}")
        if gpus:
            lines.append(f"    GPU links: {f.get('links', '?')}  [{f.get('links_source', '-')}]")
        probes = [facts[r]["gpu_probe"] for r in ranks if facts[r].get("gpu_probe") is not None]
        if gpus and len(probes) == len(ranks):  # physical GPUs compared: per-rank CUDA_VISIBLE_DEVICES is fine
            from .runtime.gpu_assignment import GpuProbe, assignment_problem

            probes = [GpuProbe(**p) for p in probes]
            shared = assignment_problem(probes)
            if shared:
                problems.append(f"node {nd}: {shared}")
        elif gpus and len(ranks) > len(gpus):
            problems.append(f"node {nd} ({hosts[0]}) runs {len(ranks)} ranks on {len(gpus)} GPUs: the GPU "
                            f"backend needs one rank per GPU")
        if gpus and len(ranks) < len(gpus):
            warnings.append(f"node {nd} ({hosts[0]}) has {len(gpus)} GPUs but runs {len(ranks)} ranks: "
                            f"{len(gpus) - len(ranks)} GPU(s) idle")
    libs = sorted({f.get("mpi_library") or "none" for f in facts})
    lines.append(f"MPI: {libs[0]} (MPI {f0.get('mpi_standard')}, mpi4py {f0.get('mpi4py')})"
                 if f0.get("mpi_library") else "MPI: not used (mpi4py missing, or running without MPI)")
    if len(libs) > 1:
        problems.append(f"ranks use different MPI libraries: {'; '.join(libs)}")
    launch = f0.get("launch_size")
    if launch and launch != size:
        problems.append(f"the launcher started {launch} ranks but MPI sees {size}: mpi4py is probably built "
                        f"against another MPI than the launcher's (check `python -c 'import mpi4py; "
                        f"print(mpi4py.get_config())'`)")
    bad_rma = [(r, d) for r, (ok, d) in enumerate(rma) if not ok]
    lines.append(f"MPI RMA: {'ok' if not bad_rma else 'FAILED'} ({rma[0][1] if not bad_rma else bad_rma[0][1]})")
    for r, d in bad_rma:
        problems.append(f"MPI RMA window test failed on rank {r}: {d} (the CPU path needs MPI-3 one-sided "
                        f"gets; with Open MPI try --mca osc rdma or --mca osc ^ucx)")
    for key, label in (("torch", "torch"), ("mgg", "mgg")):
        vers = sorted({str(f.get(key)) for f in facts})
        if len(vers) > 1:
            problems.append(f"ranks run different {label} versions: {', '.join(vers)}")
    any_gpu = any(f.get("gpus") for f in facts)
    nv = [f["nvshmem"] for f in facts]
    if any_gpu:
        ok = all(s["importable"] for s in nv)
        ver = sorted({str(s["version"]) for s in nv if s["version"]})
        lines.append(f"NVSHMEM: {'importable' if ok else 'NOT usable'}"
                     f" ({', '.join(ver) or 'version unknown'}; {nv[0].get('dist') or 'nvshmem.core'})")
        if not ok:
            bad = next(s for s in nv if not s["importable"])
            msg = (f"NVSHMEM (nvshmem.core) does not import: {bad['error']}; install mgg[gpu] "
                   f"(nvshmem4py-cu13)")
            (problems if backend == "gpu" else warnings).append(
                msg + ("" if backend == "gpu" else "; --backend auto falls back to the CPU path"))
        env = facts[0].get("env", {})
        if env.get("NVSHMEM_DISABLE_NVLS") != "1":
            warnings.append("NVSHMEM_DISABLE_NVLS is not 1: NVLink multicast (NVLS) objects can fail to "
                            "allocate or hang; launch/mpirun.sh and launch/srun.sh set it")
        if len(nodes) > 1 and not env.get("NVSHMEM_REMOTE_TRANSPORT") and not env.get("NVSHMEM_BOOTSTRAP"):
            warnings.append("several nodes but neither NVSHMEM_BOOTSTRAP nor NVSHMEM_REMOTE_TRANSPORT is set: "
                            "see docs/multinode.md (NVSHMEM_BOOTSTRAP=MPI, IB transport)")
    else:
        dist = nv[0].get("dist")
        lines.append(f"NVSHMEM: not usable here (no GPU){'; ' + dist + ' ' + str(nv[0]['version']) + ' installed' if dist else '; not installed'}")
        lines.append("GPUs: none; mgg runs the CPU path (MPI RMA)")
        if backend == "gpu":
            problems.append("--backend gpu, but no rank sees a CUDA GPU")
    return lines, problems, warnings


def _ranges(ranks: list[int]) -> str:
    out, start = [], None
    for k, r in enumerate(ranks):
        if start is None:
            start = r
        if k + 1 == len(ranks) or ranks[k + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


@dataclasses.dataclass(frozen=True)
class DoctorSettings:
    """The settings of `python -m mgg.doctor`, each field with the flag that sets it
    (mgg.apps.flag_spec: the parser is built from these fields)."""

    backend: str = backend_setting(help="the backend the job will use: gpu makes a missing GPU/NVSHMEM a problem")
    timeout: float = setting(120.0, Flag("--timeout", type=float,
                                         help="seconds a collective step may take before the job aborts (default "
                                         "{default:g})"))
    ranks_per_node: int | None = ranks_per_node_setting(help="node grouping override, as mgg.train --ranks-per-node")
    json: str | None = setting(None, Flag("--json", metavar="PATH", help="also write the report as JSON (rank 0)"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mgg.doctor", description="Check an mgg setup before a long job "
                                "(run it the way the job runs: alone, under mpirun or srun).")
    add_flags(p, DoctorSettings)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_settings(build_parser(), DoctorSettings, argv)
    from .runtime import abort_on_error, world
    from .runtime.comm import import_mpi, mpi_env_defaults
    from .runtime.launch_env import launch_problem

    mpi_env_defaults()  # before the mpi4py import below

    mpi_error = None
    try:
        import_mpi()
    except Exception as e:  # noqa: BLE001 - ImportError, or libmpi missing
        mpi_error = f"{type(e).__name__}: {e}"
    comm = world(use_mpi=None if mpi_error is None else False, check_launch=False)  # reported below
    if args.ranks_per_node:
        comm.ranks_per_node = args.ranks_per_node
    if comm.size > 1:
        comm.start_watchdog(args.timeout)
    code = 1
    with abort_on_error(comm, "mgg.doctor"):
        facts = local_facts(comm)
        if mpi_error:
            facts["problems"].append(f"mpi4py does not import ({mpi_error}): mgg cannot run on several ranks")
        launch = launch_problem("mgg.train")
        if launch:
            facts["problems"].append(launch)
        # the GPU links of a node, probed once (by the node's first rank)
        node_of = [int(n) for n in comm.node_of_ranks()]
        first = min(r for r in range(comm.size) if node_of[r] == node_of[comm.rank])
        if comm.rank == first and facts.get("gpus"):
            facts["links"], facts["links_source"] = _gpu_links(len(facts["gpus"]))
        all_facts = comm.allgather(facts)
        with comm.guard("RMA test"):
            rma = comm.allgather(_rma_test(comm))
        report = None
        if comm.rank == 0:
            lines, problems, warnings = analyse(all_facts, node_of, rma, args.backend, comm.size)
            out = ["mgg doctor", *lines]
            out += [f"WARNING: {w}" for w in warnings]
            out += [f"PROBLEM: {p}" for p in problems]
            out.append(f"result: {'usable' if not problems else f'{len(problems)} problem(s)'}")
            print("\n".join(out), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"facts": all_facts, "node_of_rank": node_of, "rma": rma,
                               "problems": problems, "warnings": warnings}, f, indent=2, default=str)
            report = 1 if problems else 0
        code = comm.bcast(report)
    if comm.watchdog is not None:
        comm.watchdog.close()
    return int(code)


if __name__ == "__main__":
    sys.exit(main())

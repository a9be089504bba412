"""`python -m mgg.build [--arch sm_90,sm_100] [--all]` (console script `mgg-build`): build the CUDA
kernels into the per-user cache ahead of a run, so that a run's first epoch starts without nvcc.

Builds every kernel module a training run may load (mgg.kernels.modules; `--all`: every module,
the embedding service's too) for the GPU architectures named by `--arch`, by default those of the
GPUs visible here. Needs nvcc (and the nvidia-nvshmem-cu13 wheel for the modules that link
NVSHMEM), not a GPU: with `--arch` it builds on a machine without one. The cache
(~/.cache/mgg/kernels, or MGG_KERNEL_CACHE) is keyed by source hash, architecture and NVSHMEM
library, so a cache built here serves any machine with the same architecture and wheel.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import Sequence

from .apps.flag_spec import Flag, add_flags, parse_settings, setting

__all__ = ["main", "build_parser", "BuildSettings", "local_archs"]

_ARCH = re.compile(r"^sm_\d{2,3}[a-z]?$")


def local_archs() -> tuple[str, ...]:
    """The distinct sm_XY of the CUDA GPUs visible here (empty without one)."""
    try:
        import torch
    except ImportError:
        return ()
    if not torch.cuda.is_available():
        return ()
    found = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        if f"sm_{major}{minor}" not in found:
            found.append(f"sm_{major}{minor}")
    return tuple(found)


def _archs(text: str) -> tuple[str, ...]:
    archs = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in archs if not _ARCH.match(a)]
    if bad or not archs:
        raise argparse.ArgumentTypeError(f"expected architectures like sm_90 or sm_90,sm_100, got {text!r}")
    return archs


@dataclass(frozen=True)
class BuildSettings:
    """The settings of `python -m mgg.build`, each field with the flag that sets it
    (mgg.apps.flag_spec: the parser is built from these fields)."""

    arch: tuple[str, ...] | None = setting(None, Flag(
        "--arch", type=_archs,
        help="comma-separated GPU architectures (e.g. sm_90,sm_100); default: the GPUs visible here"))
    all: bool = setting(False, Flag("--all", action="store_true",
                                    help="every kernel module, not only those training loads"))
    jobs: int | None = setting(None, Flag(
        "--jobs", type=int, help="parallel builds (default: one a module, at most the CPUs here; or MGG_BUILD_JOBS)"))
    list: bool = setting(False, Flag("--list", action="store_true",
                                     help="print the modules and whether each is cached; build nothing"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mgg.build", description=__doc__.split("\n\n")[0])
    add_flags(p, BuildSettings)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Build (or with --list, report) the kernels; 0 when all are in the cache, 2 on an error (one line)."""
    args = parse_settings(build_parser(), BuildSettings, argv)
    from .kernels.build import cache_dir, cubin_target
    from .kernels.modules import expand_specs, module_names
    from .kernels.prebuild import KernelBuildError, KernelPrebuild

    archs = args.arch or local_archs()
    if not archs:
        sys.stderr.write("error: no CUDA GPU is visible here: name the target architectures with --arch "
                         "(e.g. --arch sm_90 for H100/H200, sm_100 for B200)\n")
        return 2
    if args.jobs is not None and args.jobs < 1:
        sys.stderr.write(f"error: --jobs must be at least 1, got {args.jobs}\n")
        return 2
    names = module_names(training_only=not args.all)
    try:
        if args.list:
            for arch in archs:
                for n, part in expand_specs(names):
                    t = cubin_target(n, arch, part=part)
                    spec = f"{n}:{part}" if part else n
                    print(f"{spec:24s} {arch:7s} {'cached ' if t.cached else 'missing'}  {t.path}")
            return 0
        pre = KernelPrebuild(names, archs, jobs=args.jobs, progress=lambda line: print(line, flush=True)).start()
        res = pre.wait()
    except (KernelBuildError, ValueError, OSError, ImportError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    total = len(expand_specs(names)) * len(archs)
    print(f"{total} CUDA kernel{'s' * (total > 1)} for {', '.join(archs)} in {cache_dir()}: "
          f"{len(res.built)} built, {len(res.cached)} already cached")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build, cache and load the CUDA C kernels that call NVSHMEM device functions.

Path (docs/kernels.md has the evidence): NVRTC through cuda.core is tried first when
`MGG_KERNEL_BUILD=nvrtc` asks for it; the default is nvcc, which compiles the source as relocatable
device code (`-rdc=true`) and device-links it against NVSHMEM's static device library
`libnvshmem_device.a` (from the nvidia-nvshmem-cu13 wheel) into a cubin. The cubin is cached on
disk, keyed by a hash of the source, the target architecture and the NVSHMEM library, so each node
builds once: the first rank takes a file lock and builds, the others wait on the lock and load
the cached file. `load_module` opens the cubin with CuPy and registers it with NVSHMEM
(`cumodule_init`) before any launch.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = ["KernelBuild", "CubinTarget", "build_cubin", "cubin_target", "load_module", "nvshmem_root", "nvcc_path",
           "cache_dir", "cuda_arch",
           "loaded_modules"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_MODULES: dict[tuple[str, int], object] = {}  # (name, GPU index) -> CuPy RawModule

_LOCK = threading.Lock()


@dataclass
class KernelBuild:
    """Where a cubin came from: path, how it was built, how long the build took (0 if cached)."""

    path: str
    method: str
    seconds: float
    cached: bool


BUILDS: dict[str, KernelBuild] = {}  # how each loaded module was built (for reports)


def nvshmem_root() -> str:
    """The NVSHMEM install (headers in include/, device library in lib/)."""
    env = os.environ.get("NVSHMEM_HOME")
    if env:
        return env
    try:
        import nvidia.nvshmem as nvn  # the nvidia-nvshmem-cu13 wheel
    except ImportError:
        raise ImportError("the kernels that call NVSHMEM link its device library, which is missing: "
                          "pip install nvidia-nvshmem-cu13 (or set NVSHMEM_HOME to an NVSHMEM install)") from None
    return list(nvn.__path__)[0]


def cache_dir() -> str:
    d = os.environ.get("MGG_KERNEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mgg", "kernels")
    os.makedirs(d, exist_ok=True)
    return d


def cuda_arch(device: int | None = None) -> str:
    """sm_XY of GPU `device` (default: the current one; MGG_CUDA_ARCH overrides; sm_90 without a GPU)."""
    if os.environ.get("MGG_CUDA_ARCH"):
        return os.environ["MGG_CUDA_ARCH"]
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device)
            return f"sm_{major}{minor}"
    except ImportError:
        pass
    return "sm_90"


_RUNNING: set = set()  # the compiler processes running now (kill_running_builds ends them)
_RUNNING_LOCK = threading.Lock()


def _run(cmd: list[str]) -> None:
    # its own process group: kill_running_builds ends nvcc with the cicc / ptxas it runs
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            out, err = proc.communicate()
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{(err or out)[-3000:]}")


def kill_running_builds() -> None:
    """End every compiler process this process started that is still running (a run that exits
    early does not leave them building for a minute)."""
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


def _nvcc() -> str:
    found = nvcc_path()
    if found is None:
        raise RuntimeError("nvcc is not on PATH (nor in $CUDA_HOME/bin or /usr/local/cuda/bin): install the "
                           "CUDA 13 toolkit, or build the kernels elsewhere with python -m mgg.build --arch "
                           "ARCH and copy the cache (MGG_KERNEL_CACHE)")
    return found


def _build_nvcc(src: str, out: str, arch: str, root: str, tmp: str) -> None:
    """Relocatable device code, device-linked against libnvshmem_device.a. The first step emits
    a relocatable cubin (`-rdc=true -cubin`): device code only, so nvcc skips the host side of
    the source (cudafe++, the host compiler, the fatbinary; a third of the step's time) that the
    device link never reads. The linked cubin is the same, byte for byte, as through a host
    object (`-c`)."""
    obj = os.path.join(tmp, "k.rdc.cubin")
    nvcc = _nvcc()
    _run([nvcc, f"-arch={arch}", "-rdc=true", "-std=c++17", "-O3", "-lineinfo", f"-I{root}/include",
          "-cubin", src, "-o", obj])
    _run([nvcc, f"-arch={arch}", "-dlink", "-cubin", obj, f"{root}/lib/libnvshmem_device.a", "-o", out])


def _build_nvrtc(src: str, out: str, arch: str, root: str, tmp: str) -> None:
    """NVRTC (relocatable cubin) + nvJitLink against libnvshmem_device.a, through cuda.core."""
    try:
        from cuda.core import Linker, LinkerOptions, ObjectCode, Program, ProgramOptions
    except ImportError:
        from cuda.core.experimental import Linker, LinkerOptions, ObjectCode, Program, ProgramOptions
    cuda_inc = [p for p in (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include"),)
                if os.path.isdir(p)]
    with open(src) as f:
        code = f.read()
    opts = ProgramOptions(arch=arch, relocatable_device_code=True, std="c++17",
                          include_path=[os.path.dirname(src), os.path.join(root, "include")] + cuda_inc)
    obj = Program(code, code_type="c++", options=opts).compile("cubin")
    lib = ObjectCode.from_library(os.path.join(root, "lib", "libnvshmem_device.a"))
    linked = Linker(obj, lib, options=LinkerOptions(arch=arch)).link("cubin")
    with open(out, "wb") as f:
        f.write(bytes(linked.code))


def _build_plain(src: str, out: str, arch: str, root: str, tmp: str, defines: tuple[str, ...] = ()) -> None:
    """A kernel without NVSHMEM calls: one nvcc -cubin, no device link (`defines`: -D macros)."""
    nvcc = _nvcc()
    _run([nvcc, f"-arch={arch}", "-cubin", "-std=c++17", "-O3", "-lineinfo", *[f"-D{d}" for d in defines],
          src, "-o", out])


_LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.M)


def source_text(src: str, _seen: frozenset = frozenset()) -> bytes:
    """The bytes of kernel source `src` and, after them, of every header it includes with
    #include "name" from its own directory (recursively, each once): what the cache key hashes,
    so that editing a shared header rebuilds every source that includes it."""
    with open(src, "rb") as f:
        text = f.read()
    seen = _seen | {os.path.abspath(src)}
    for name in _LOCAL_INCLUDE.findall(text):
        path = os.path.join(os.path.dirname(src), name.decode())
        if os.path.abspath(path) in seen or not os.path.exists(path):
            continue
        text += b"\n// --- " + name + b"\n" + source_text(path, seen)
        seen |= {os.path.abspath(path)}
    return text


def nvcc_path() -> str | None:
    """The nvcc that builds the kernels: on PATH, else CUDA_HOME's or /usr/local/cuda's; None if none."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


@dataclass(frozen=True)
class CubinTarget:
    """Where the cubin of one (source, architecture, NVSHMEM library, defines) lives in the cache."""

    name: str
    arch: str
    nvshmem: bool
    defines: tuple[str, ...]
    src: str
    root: str     # the NVSHMEM install ("" for a plain build)
    path: str     # the cubin
    lock: str     # the file lock its builder holds
    part: str | None = None  # the registered part of the module it holds (None: the whole source)

    @property
    def cached(self) -> bool:
        return os.path.exists(self.path)


def cubin_target(name: str, arch: str | None = None, nvshmem: bool | None = None,
                 defines: tuple[str, ...] = (), part: str | None = None) -> CubinTarget:
    """The cache entry of mgg/kernels/<name>.cu for `arch` (default: this GPU's, cuda_arch), keyed
    by a hash of the source with its local headers, the architecture and the NVSHMEM device
    library. `nvshmem` None: the module's registered flag (mgg.kernels.modules). `part`: one of
    the module's registered parts (its -D macro is added to `defines`)."""
    label, extra = name, len(defines)
    if nvshmem is None or part is not None:
        from .modules import kernel_module

        if nvshmem is None:
            nvshmem = kernel_module(name).nvshmem
        if part is not None:
            defines = tuple(defines) + kernel_module(name).part_defines(part)
            label = f"{name}.{part}"
    if defines and nvshmem:
        raise ValueError(f"build_cubin({name!r}): defines are for plain (nvshmem=False) builds")
    arch = arch or cuda_arch()
    src = os.path.join(_HERE, f"{name}.cu")
    text = source_text(src) + "".join(f"\n// -D{d}" for d in defines).encode()
    if nvshmem:
        root = nvshmem_root()
        lib = os.path.join(root, "lib", "libnvshmem_device.a")
        libsig = f"{os.path.getsize(lib)}:{int(os.path.getmtime(lib))}" if os.path.exists(lib) else root
    else:
        root, libsig = "", "plain"
    key = hashlib.sha256(text + arch.encode() + libsig.encode()).hexdigest()[:20]
    d = cache_dir()
    out = os.path.join(d, f"{label}{'-defs' if extra else ''}-{arch}-{key}.cubin")
    return CubinTarget(name, arch, bool(nvshmem), tuple(defines), src, root, out,
                       os.path.join(d, f"{label}-{arch}-{key}.lock"), part)


def build_cubin(name: str, arch: str | None = None, nvshmem: bool | None = None,
                defines: tuple[str, ...] = (), part: str | None = None) -> KernelBuild:
    """Compile mgg/kernels/<name>.cu for `arch` into a cached cubin; returns where it is.

    `nvshmem=False` builds a source that calls no NVSHMEM device function as a plain cubin (no
    NVSHMEM install needed); None: the module's registered flag. `defines`: preprocessor macros
    (NAME or NAME=VALUE) for a variant of the source a tool needs (e.g. the benchmark's
    MGG_CSR_GATHER_ONLY); plain builds only, cached apart from the plain build. Safe from several
    threads and processes at once: one builds a given cubin, the others wait and load it.
    `part`: one registered part of the module (mgg.kernels.modules), built alone."""
    t = cubin_target(name, arch, nvshmem, defines, part)
    src, out, root, arch, nvshmem, defines = t.src, t.path, t.root, t.arch, t.nvshmem, t.defines
    meta = out + ".json"
    with open(t.lock, "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)  # one builder per node; the others wait, then hit the cache
        try:
            if os.path.exists(out):
                m = json.load(open(meta)) if os.path.exists(meta) else {"method": "unknown"}
                return KernelBuild(out, m.get("method", "unknown"), 0.0, True)
            want = os.environ.get("MGG_KERNEL_BUILD", "nvcc") if nvshmem else "plain"
            methods = {"plain": [_build_plain], "nvcc": [_build_nvcc], "nvrtc": [_build_nvrtc, _build_nvcc],
                       "auto": [_build_nvrtc, _build_nvcc]}.get(want)
            if nvshmem and want == "plain":
                methods = None
            if methods is None:
                raise ValueError(f"MGG_KERNEL_BUILD must be nvcc, nvrtc or auto, got {want!r}")
            errors = []
            t0 = time.perf_counter()
            # in the system's temp folder: a build killed at exit leaves nothing in the cache
            with tempfile.TemporaryDirectory(prefix="mgg-build-") as tmp:
                staged = os.path.join(tmp, "k.cubin")
                for fn in methods:
                    try:
                        fn(src, staged, arch, root, tmp, defines) if defines else fn(src, staged, arch, root, tmp)
                        method = fn.__name__.replace("_build_", "")
                        break
                    except Exception as e:  # noqa: BLE001 - recorded, next method tried
                        errors.append(f"{fn.__name__}: {type(e).__name__}: {e}")
                else:
                    what = f"{name}.cu ({part})" if part else f"{name}.cu"
                    raise RuntimeError(f"building {what} for {arch} failed:\n" + "\n".join(errors))
                secs = time.perf_counter() - t0
                with open(meta + ".tmp", "w") as f:
                    json.dump({"method": method, "seconds": secs, "arch": arch, "errors": errors}, f)
                part_file = f"{out}.{os.getpid()}.part"
                shutil.copyfile(staged, part_file)
                os.replace(part_file, out)  # whole or absent: a reader never sees a partial cubin
                os.replace(meta + ".tmp", meta)
            return KernelBuild(out, method, secs, False)
        finally:
            fcntl.flock(lk, fcntl.LOCK_UN)


def loaded_modules() -> tuple[str, ...]:
    """The modules this process has loaded (on any GPU) as build specs ("aggregate",
    "local_csr:fp32" for a part), sorted."""
    with _LOCK:
        mods = list(_MODULES.items())
    names = set()
    for (name, _), mod in mods:
        if isinstance(mod, PartedModule):
            names.update(f"{name}:{p}" for p in list(mod.parts))
        else:
            names.add(name)
    return tuple(sorted(names))


class PartedModule:
    """A module built as several cubins (mgg.kernels.modules: `parts`) on one GPU: `get_function`
    loads, on first use, the part that holds the function (building it if the cache lacks it)."""

    def __init__(self, name: str, device: int):
        from .modules import kernel_module

        self.name, self.device = name, int(device)
        self.spec = kernel_module(name)
        self.parts: dict[str, object] = {}  # part -> CuPy RawModule
        self._lock = threading.Lock()

    def part(self, part: str):
        """The CuPy RawModule of `part` on this module's GPU."""
        with self._lock:
            mod = self.parts.get(part)
            if mod is None:
                import cupy

                b = build_cubin(self.name, part=part)
                with cupy.cuda.Device(self.device):
                    mod = cupy.RawModule(path=b.path)
                    mod.module  # noqa: B018 - loaded now, on this GPU (CuPy loads on first use)
                self.parts[part] = mod
                BUILDS[f"{self.name}:{part}"] = b
            return mod

    def get_function(self, function: str):
        import cupy

        mod = self.part(self.spec.part_of(function))
        with cupy.cuda.Device(self.device):  # the function handle of this GPU's copy
            return mod.get_function(function)


def load_module(name: str, nvshmem: bool | None = None, device: int | None = None):
    """The CuPy RawModule of mgg/kernels/<name>.cu on GPU `device` (default: the current one),
    built (cached) and NVSHMEM-initialised once per GPU. `name` must be registered in
    mgg.kernels.modules (the list the prebuild reads), and `nvshmem`, when given, must agree with
    its registered flag (False: a plain module, see build_cubin). A module registered with parts
    comes as a PartedModule (the same `get_function`). A CUDA module belongs to one GPU's
    context: a kernel of it launched on another GPU's stream reads that GPU's pointers through
    the wrong context (an illegal address), so
    modules are cached by (name, GPU) and loaded with that GPU current. Launch through
    mgg.kernels.launch, which does the same for function handles and streams."""
    from .modules import kernel_module

    registered = kernel_module(name).nvshmem  # ValueError for a module the registry does not list
    if nvshmem is not None and bool(nvshmem) != registered:
        raise ValueError(f"load_module({name!r}, nvshmem={nvshmem}): mgg.kernels.modules registers it with "
                         f"nvshmem={registered}")
    nvshmem = registered
    if kernel_module(name).parts:
        idx = _current_device() if device is None else int(device)
        with _LOCK:
            return _MODULES.setdefault((name, idx), PartedModule(name, idx))
    import cupy

    idx = _current_device() if device is None else int(device)
    with _LOCK:
        mod = _MODULES.get((name, idx))
        if mod is not None:
            return mod
        b = build_cubin(name, nvshmem=nvshmem)
        with cupy.cuda.Device(idx):
            mod = cupy.RawModule(path=b.path)
            mod.module  # noqa: B018 - loaded now, on this GPU (CuPy loads on first use)
            if nvshmem:
                import nvshmem.bindings as nb

                status = nb.cumodule_init(int(mod.module.ptr))  # loads the module on this GPU
                if status not in (0, None):
                    raise RuntimeError(f"nvshmem cumodule_init({name}) failed with status {status}")
        BUILDS[name] = b
        _MODULES[(name, idx)] = mod
        return mod


def _current_device() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDevice())

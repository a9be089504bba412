"""GPU tests under mpirun: each rank works on its own GPU (local rank modulo the GPUs seen:
mgg.runtime.gpu_assignment.device_index) from collection on, as `mgg.train` and the NVSHMEM store
do. Test modules that fix their device at import (`DEV = torch.device("cuda",
torch.cuda.current_device())`) then use the rank's GPU, not GPU 0 on every rank."""
import os

import torch

from mgg.runtime.gpu_assignment import device_index

_LOCAL_RANK = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
if _LOCAL_RANK is not None and torch.cuda.is_available():
    torch.cuda.set_device(device_index(int(_LOCAL_RANK), torch.cuda.device_count()))

"""bench/dlrm.py's two DLRM designs on the GPU: mgg's step (NVSHMEM store) and the NCCL all-to-all
design give the losses, tables and MLP weights of the float64 single-process DLRM. Runs alone
(P = 1) and under `mpirun -np N python -m pytest tests/bench/test_dlrm_bench_gpu.py` (every rank
on its own GPU); skipped without a GPU."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")
pytest.importorskip("nvshmem.core")

import torch.distributed as tdist  # noqa: E402

from bench import dlrm as bench_dlrm  # noqa: E402
from bench.dlrm_a2a import AllToAllDLRM  # noqa: E402
from mgg.embedding.dlrm_data import DLRMBatches  # noqa: E402
from mgg.embedding.dlrm_model import DLRMConfig  # noqa: E402
from mgg.embedding.dlrm_train import MggDLRM  # noqa: E402
from mgg.graph import make_store  # noqa: E402
from mgg.runtime import world  # noqa: E402
from mgg.testing.dlrm_reference import ReferenceDLRM  # noqa: E402

CFG = DLRMConfig(cards=(50, 2, 3000, 3, 10000, 1), dim=8, bot=(16,), top=(32, 1), zipf=1.05, lr=0.5, emb_lr=0.3, seed=4)
B, STEPS = 256, 4


def test_both_designs_train_the_float64_reference_on_gpus():
    comm = world()
    store = make_store(comm, "gpu")
    device = bench_dlrm.init_torch_distributed(comm, "gpu")
    mgg_model = MggDLRM(CFG, comm, store)
    try:
        designs = {"mgg": mgg_model, "a2a": AllToAllDLRM(CFG, device)}
        assert mgg_model.device.type == "cuda"
        ref = ReferenceDLRM(CFG, B, comm.size)
        want = [ref.step() for _ in range(STEPS)]
        for name, m in designs.items():
            got = bench_dlrm.run_steps(m, DLRMBatches(CFG, B, comm.rank), STEPS, device, comm)
            assert got == pytest.approx(want, rel=1e-4), name
            for t in range(CFG.num_tables):
                torch.testing.assert_close(m.table(t).double(), ref.tables[t], rtol=1e-3, atol=1e-5, msg=f"{name} table {t}")
    finally:
        mgg_model.free()
        tdist.destroy_process_group()

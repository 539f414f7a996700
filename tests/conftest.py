import pytest
import torch


@pytest.fixture(autouse=True)
def _float64_and_seed():
    """Tests run in float64 with a fixed seed (float32 cases ask for it explicitly)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)


# One intra-op thread: the tests use small tensors, for which a second OpenMP thread only adds
# synchronisation (and, on a loaded 2-core machine, spin-waits that slow tiny ops 100×).
torch.set_num_threads(1)

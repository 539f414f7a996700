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

import warnings

import pytest
import torch
# An operator's first call evaluates without torch.func while torch.func has not run in the process
# (asd.operators._torch_func_cold): tests/test_cold_start.py covers that in fresh processes; here
# every test sees the warm state of a long-running program, whatever ran before it.
import torch._dynamo  # noqa: F401,E402

# Two cores shared by everything: keep torch from oversubscribing them in tests.
torch.set_num_threads(1)
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_cache():
    import asd

    asd.clear_cache()
    yield
    asd.clear_cache()


@pytest.fixture(autouse=True)
def _default_dtype_is_restored():
    """Every test starts from, and must leave, torch's float32 default dtype."""
    assert torch.get_default_dtype() == torch.float32, "a test module changed torch's default dtype"
    yield

"""Helpers of the hand-value tests of algorithms.py and losses.py (tests/test_algorithms.py,
tests/test_losses.py): float64 as the default dtype inside a test, a tensor maker and a tight comparison."""
import pytest
import torch

NAN = float("nan")


@pytest.fixture(autouse=True)
def float64_default():
    """Float64 inside these tests only: the default dtype is process-wide, so restore it after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def close(a, b, tol=1e-9):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               rtol=tol, atol=tol)

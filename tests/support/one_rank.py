"""A one-rank process group for tests that call the trainer's functions in the test process: `python
train.py` runs as rank 0 of 1, so train.update's sums and maxima over ranks are the process's own figures."""
import pytest
import torch.distributed as dist


@pytest.fixture
def one_rank(tmp_path):
    """Rank 0 of a gloo group of one, torn down after the test (the default group is process-wide)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'one_rank_pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()

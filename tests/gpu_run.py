"""train.py with every rank's generator a VLLMEngine in GPU mode around tests/gpu_standin.StandInLLM:
    GPU_STANDIN_LOG=<dir> torchrun --nproc_per_node 2 tests/gpu_run.py <train.py arguments>"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from tests.gpu_standin import standin_engine  # noqa: E402

train.make_engine = standin_engine  # the one substitution: what vLLM would be on a GPU
train.main(sys.argv[1:])

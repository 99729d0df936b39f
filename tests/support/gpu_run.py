"""train.py with every rank's generator a VLLMEngine in GPU mode around tests/support/gpu_standin.StandInLLM:
    GPU_STANDIN_LOG=<dir> torchrun --nproc_per_node 2 tests/support/gpu_run.py <train.py arguments>
GPU_STANDIN_WITHOUT_VLLM=1 hides an installed vLLM, as on a GPU image without it (bench/gpu_run.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
if os.environ.get("GPU_STANDIN_WITHOUT_VLLM"):
    sys.modules["vllm"] = None  # `import vllm` now fails as if it were not installed
from launch import startup  # noqa: E402
import train  # noqa: E402
from tests.support.gpu_standin import standin_engine  # noqa: E402

startup.make_engine = standin_engine  # the one substitution: what vLLM would be on a GPU (startup.setup starts it)
train.main(sys.argv[1:])

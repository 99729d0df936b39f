"""Run under torchrun: after training steps on sharded weights and a sync, every rank's engine must
score a fixed sequence exactly as the trainer does. Prints `max logprob diff: X` on rank 0."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import batch as batch_  # noqa: E402
from infra import distributed  # noqa: E402
from engine import Sampling, make_engine  # noqa: E402
from models.tiny import tiny_model_dir  # noqa: E402

kind = sys.argv[1] if len(sys.argv) > 1 else "auto"
rank, world = distributed.setup_distributed("cpu")
path = tiny_model_dir()
policy = distributed.shard(AutoModelForCausalLM.from_pretrained(path), init_device_mesh("cpu", (world,)), "float32", False)
engine = make_engine(path, kind, seed=rank)
opt = torch.optim.AdamW(policy.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(rank)
for _ in range(3):  # move the weights far from the engine's copy
    ids = torch.randint(0, 1400, (2, 16), generator=gen)
    policy(input_ids=ids).logits[..., 100].mean().backward()
    opt.step()
    opt.zero_grad()
weights = distributed.full_tensors(policy, torch.float32)
engine.sync_weights(weights)
for _ in weights:
    pass
prompt = [5, 17, 230, 41, 99, 7]
sample = engine.generate([prompt], Sampling(max_tokens=12, temperature=1.0, seed=3))[0]
batch = {"ids": torch.tensor([prompt + sample.ids]), "attn": torch.ones(1, len(prompt) + len(sample.ids), dtype=torch.long)}
with torch.no_grad():
    lp, _ = batch_.forward(policy, batch, [0], 1.0)
diff = (lp[0, len(prompt):] - torch.tensor(sample.logprobs)).abs().max()
diffs = [None] * world
dist.all_gather_object(diffs, float(diff))
if rank == 0:
    print(f"max logprob diff: {max(diffs):.3e}", flush=True)
dist.barrier()
engine.close()
if dist.is_initialized():
    dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # no interpreter teardown: gloo's threads can abort it (infra/lifeline.finish)

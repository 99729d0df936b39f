"""TRL trains on a served env of ours: GRPOTrainer's own OpenEnv route, `environment_factory`, against
`python -m envs.openenv_serve`, offline, on the tiny model.

    python bench/trl_peer.py --install     # once: bench/.trl-venv (the project's torch and transformers + trl)
    python bench/trl_openenv.py [--env textcraft] [--steps 2]

This script (the project's python) starts the server on 127.0.0.1 and builds the tiny model, then runs
itself in the TRL venv (`--url`), where GRPOTrainer trains `--steps` steps. The environment class is what
a TRL user writes for any OpenEnv server (`Served` below): one OpenEnv client session per instance;
`reset(task_id)` plays that task (a dataset column) and returns its first observation, which TRL appends
to the prompt; `act(action)` is the tool the model calls, sent to the server as the reply's action;
`get_reward()` is the env's running score (ours: the last step's). TRL's tool calling needs a chat
template whose tool calls it can parse: the tiny model's tokenizer is given TRL's own copy of Qwen3's.

OpenEnv's client (`openenv-core`) is read from the project's venv, appended to the TRL venv's path after
its own packages (both venvs pin the same versions, requirements.txt being the constraints). Printed:
each step's time and reward, the resets, tool calls and rewards the server's sessions saw, the versions.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROMPT = ("Play the task below. Call the `act` tool with one action at a time, e.g. act(action=\"get 1 oak logs\"), "
          "until the goal is reached.")


# ------------------------------------------------------------------ the TRL side (the TRL venv's python)

def trl_side(args) -> None:
    sys.path.append(args.client_path)  # OpenEnv's client, after the TRL venv's own packages
    import torch
    from datasets import Dataset
    from openenv.core import GenericEnvClient
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    seen = {"resets": 0, "tool_calls": 0, "rewards": []}

    class Served:
        """A served env of ours as TRL's environment: one OpenEnv WebSocket session per instance."""

        def __init__(self):
            self.client = GenericEnvClient(base_url=args.url).sync()
            self.client.connect()
            self.reward = 0.0

        def reset(self, task_id: int, **_) -> str:
            seen["resets"] += 1
            self.reward = 0.0
            return self.client.reset(task_id=task_id).observation["text"]

        def act(self, action: str) -> str:
            """Carry out one action in the environment.

            Args:
                action: the action, e.g. "get 1 oak logs" or "craft 4 oak planks using 1 oak logs"

            Returns:
                What the environment answers.
            """
            seen["tool_calls"] += 1
            result = self.client.step({"text": f"Thought:\nOne step.\n\nAction:\n{action}"})
            self.reward = float(result.reward or 0.0)
            return result.observation["text"]

        def get_reward(self) -> float:
            seen["rewards"].append(self.reward)
            return self.reward

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    tokenizer.chat_template = qwen3_chat_template  # a template TRL parses tool calls of
    tasks = json.loads(args.tasks)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": PROMPT}], "task_id": t} for t in tasks])
    config = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-openenv-"), use_cpu=True, bf16=False, max_steps=args.steps,
                        per_device_train_batch_size=4, num_generations=4, max_completion_length=24,
                        max_tool_calling_iterations=3, learning_rate=1e-4, beta=0.0, logging_steps=1,
                        report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0)
    steps = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            steps.append(time.perf_counter() - self.start)

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs:
                print(f"[trl] step {len(steps)}: {steps[-1]:.1f} s, reward {logs['reward']:.3f}", flush=True)

    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer,
                          environment_factory=Served, callbacks=[Clock()])
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    moved = sum(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    import transformers
    import trl
    Path(args.result).write_text(json.dumps({
        "steps": len(steps), "step_s": steps, "resets": seen["resets"], "tool_calls": seen["tool_calls"],
        "rewards": seen["rewards"], "parameters_changed": moved,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}}))


# ------------------------------------------------------------------ the project side

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="textcraft", help="the served env (default textcraft)")
    ap.add_argument("--steps", type=int, default=2, help="GRPOTrainer's steps (default 2)")
    ap.add_argument("--venv", type=Path, default=HERE / ".trl-venv", help="the TRL venv (default bench/.trl-venv)")
    ap.add_argument("--url", help=argparse.SUPPRESS)  # given: this is the TRL side
    for hidden in ("--model-dir", "--tasks", "--result", "--client-path"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.url:
        return trl_side(args)
    python = args.venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"error: no TRL venv at {args.venv}; create it with `python bench/trl_peer.py --install`")
    sys.path.insert(0, str(ROOT))
    import envs
    from bench.machine import cpu_name
    from models import tiny
    from bench.serve_load import free_port, wait_healthy

    port, model_dir = free_port(), tiny.tiny_model_dir()
    tasks = envs.make(args.env).tasks("train")[:8]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "envs.openenv_serve", "--env", args.env, "--port", str(port)],
                              cwd=ROOT)
    result = Path(tempfile.mkdtemp(prefix="trl-openenv-")) / "result.json"
    try:
        wait_healthy(url)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false", TRL_EXPERIMENTAL_SILENCE="1")
        start = time.perf_counter()
        code = subprocess.run([str(python), __file__, "--url", url, "--model-dir", model_dir, "--tasks", json.dumps(tasks),
                               "--result", str(result), "--client-path", sysconfig.get_paths()["purelib"]],
                              cwd=ROOT, env=env).returncode
    finally:
        server.terminate()
        server.wait()
    if code or not result.exists():
        raise SystemExit(f"error: TRL's side failed (exit {code})")
    out = json.loads(result.read_text())
    print(f"\nTRL GRPOTrainer (environment_factory) on the served {args.env}: {out['steps']} steps in "
          f"{time.perf_counter() - start:.0f} s ({', '.join(f'{s:.1f}' for s in out['step_s'])} s a step); the server's "
          f"sessions saw {out['resets']} resets and {out['tool_calls']} tool calls; rewards "
          f"{sorted(set(out['rewards']))}; {out['parameters_changed']} parameter tensors changed")
    print(f"CPU: {cpu_name()}; " + ", ".join(f"{k} {v}" for k, v in out["versions"].items()))


if __name__ == "__main__":
    main()

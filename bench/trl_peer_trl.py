"""TRL's side of bench/trl_peer.py (which says what is measured): GRPOTrainer on the shared workload in one
process with 2 torch threads, run by the TRL venv's python (bench/.trl-venv, `python bench/trl_peer.py
--install`). Imports nothing of the project but bench/trl_peer.py's workload helpers.

Timing from inside the trainer: a callback clocks each optimizer step (`on_step_begin` to `on_step_end`:
the generation batch's generation and scoring, the forward and backward of its micro-batches, clipping,
AdamW); `_generate_and_score_completions` (TRL's generation phase) and `_generate_single_turn` (the
transformers `generate` call alone, which also shows the prompt and completion lengths TRL ran) are
wrapped with a clock. update = step - generation phase. Writes the figures as JSON to `--result`.
"""
from __future__ import annotations

import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trl_peer import chat_ids, means, prompt_texts, reward, side_parser  # noqa: E402


def hash_reward(completion_ids, **_) -> list[float]:
    """GRPOTrainer's reward function: bench/trl_peer.py's `reward` of each completion's token ids."""
    return [reward(ids) for ids in completion_ids]


def timed(obj, name: str, into: dict, key: str, seen: list | None = None):
    """Wrap method `name` of `obj`: add its seconds to `into[key]`; `seen` gets its first positional argument."""
    method = getattr(obj, name)

    def wrapper(*args, **kwargs):
        if seen is not None:
            seen.append(args[0])
        start = time.perf_counter()
        out = method(*args, **kwargs)
        into[key] += time.perf_counter() - start
        return out

    setattr(obj, name, wrapper)


def main() -> None:
    ap = side_parser(__doc__.split("\n")[0])
    args = ap.parse_args()

    import torch

    torch.set_num_threads(2)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    texts = prompt_texts(lambda t: len(chat_ids(tokenizer, t)), args.prompts, args.prompt_tokens, args.seed)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": t}]} for t in texts])
    generation_batch = args.prompts * args.samples
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-peer-out-"), use_cpu=True, bf16=args.dtype == "bfloat16",
        use_vllm=False, per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=generation_batch // args.micro,  # one optimizer step per generation batch
        num_generations=args.samples, max_completion_length=args.completion_tokens,
        generation_kwargs={"min_new_tokens": args.completion_tokens},  # no end of turn before the cap
        temperature=1.0, top_p=1.0, beta=0.0, gradient_checkpointing=args.checkpointing, max_steps=args.steps,
        learning_rate=1e-6, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)

    steps: list[dict] = []
    phase = {"generation": 0.0, "generate": 0.0}
    prompts_seen: list = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            phase.update(generation=0.0, generate=0.0)
            self.start, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, *_, **__):
            step = time.perf_counter() - self.start
            steps.append(dict(step=step, generation=phase["generation"], generate=phase["generate"],
                              update=step - phase["generation"], step_cpu=time.process_time() - self.cpu))
            print(f"[trl] step {len(steps)}/{args.steps}: {step:.1f} s (generation {phase['generation']:.1f} s, "
                  f"update {step - phase['generation']:.1f} s)", flush=True)

    trainer = GRPOTrainer(model=model, reward_funcs=hash_reward, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer.remove_callback(PrinterCallback)  # TRL's metrics dict after every step; the Clock prints instead
    timed(trainer, "_generate_and_score_completions", phase, "generation")
    timed(trainer, "_generate_single_turn", phase, "generate", prompts_seen)
    lengths = []
    original = trainer._calculate_rewards

    def rewards(inputs, prompts, completions, completion_ids_list):  # records the completion lengths
        lengths.extend(len(c) for c in completion_ids_list)
        return original(inputs, prompts, completions, completion_ids_list)

    trainer._calculate_rewards = rewards
    print(f"[trl] {args.steps} steps, threads {torch.get_num_threads()}, checkpointing "
          f"{'on' if args.checkpointing else 'off'}, bf16 {config.bf16}", flush=True)
    trainer.train()

    prompt_lengths = sorted({len(p) for call in prompts_seen for p in call})
    mean = dict(means(steps), maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    notes = (f"1 process, {torch.get_num_threads()} threads; prompt tokens {prompt_lengths[0]}-{prompt_lengths[-1]}, "
             f"completion tokens {min(lengths)}-{max(lengths)}; transformers generate {mean['generate']:.2f} s "
             f"of the generation phase")
    shutil.rmtree(config.output_dir, ignore_errors=True)
    Path(args.result).write_text(json.dumps(dict(steps=steps, mean=mean, notes=notes, prompt_lengths=prompt_lengths,
                                                 completion_lengths=[min(lengths), max(lengths)])))


if __name__ == "__main__":
    main()

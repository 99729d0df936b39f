"""The machinery the trainer needs, apart from the algorithm it runs: processes and shards
(distributed.py), crash-safe checkpoints (checkpoint.py), the memory plan (memplan.py), the launcher
that names a dead rank's cause (lifeline.py), fault points for the crash tests (faults.py), the run's
logs (runlog.py) and their trackers (trackers.py), the shared-prefix forward (prefix.py), LoRA's adapters
(lora.py), the project's own decode loop (decode.py), the generator's contract (samples.py), how the
update's passes run (passes.py), the presets (recipes.py) and how an episode opens (framing.py). Nothing
here imports lab/: a run writes files, and the study reads them."""

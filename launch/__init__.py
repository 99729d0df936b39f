"""A run's set-up, before step 0: the config checked and every setting derived from it in one place
(checks.py: `check`, `derive`, `Derived`), then the run assembled from it (startup.py: `setup`, `Run`): the
process group, models, optimizers, generator, environments, warm start and the studies' hooks. Only the entry
points (train.py, evaluate.py) and lab/ import it; nothing it assembles does.
"""

"""The project's own studies beside the paper's method: each off by default, named by its flag, and reached by
the training step through one object, `Studies` (hooks.py), at two points: `rollout` around step (1)'s rollout,
`advantages` around step (3). Both give back the method's own values when every study is off, and a run with
every study off builds no hooks at all (`Studies.make` gives None: its step calls the method directly). train.py,
rollout.py, algorithms.py and batch.py name none of them.

| flag | what it changes | hook (its part) | published |
|---|---|---|---|
| --curriculum | a step's tasks: levels weighed by how often their groups were informative (curriculum.py) | `rollout` (`tasks`), `advantages` (`observe`) | docs/results.md (validation) |
| --min-groups | the optimizer steps only once enough informative groups were added up (curriculum.py) | `advantages` (`observe`) | docs/results.md (validation) |
| --dynamic-sampling | more rounds of fresh tasks within a step while too few groups were informative (dynamic.py) | `rollout` | not yet screened |
| --sometimes-solved | a step's tasks: those the policy sometimes solves, learnt from its rollouts (solved.py) | `rollout` (`tasks`) | not yet screened |
| --refusal-penalty | the training reward, less a penalty per turn the env refused | `advantages` (`rewards`) | results/babyai-grpo-refusal-drgrpo |
| --positive-only | the advantages' positive part only: a filtered self-imitation of the policy's wins | `advantages` (`positive`) | docs/results.md (validation) |
| --bc-anchor | an imitation gradient beside RL's in every optimizer step (warmstart.Anchor) | `advantages` (`Shaped.anchor`) | results/babyai-grpo-anchor |

Tests: python -m pytest tests/test_studies.py (and each study's own tests, named in its docstring).
"""

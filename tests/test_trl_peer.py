"""bench/trl_peer.py's pure helpers: the seeded prompts, the hash reward, the warm-up-free means and the
side-by-side table (the benchmark itself runs for minutes and is not a test)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import trl_peer  # noqa: E402


def test_prompts_are_seeded_and_just_reach_the_length():
    words = lambda text: len(text.split()) + 10  # noqa: E731  (a stand-in for the chat-templated token count)
    texts = trl_peer.prompt_texts(words, 3, 120, seed=0)
    assert texts == trl_peer.prompt_texts(words, 3, 120, seed=0)
    assert texts != trl_peer.prompt_texts(words, 3, 120, seed=1)
    assert len(set(texts)) == 3
    for text in texts:  # one sentence (10 words) fewer would be under the length
        assert 120 <= words(text) < 120 + 10


def test_reward_is_a_deterministic_hash_in_the_unit_interval():
    rewards = [trl_peer.reward([i, i + 1, 7]) for i in range(50)]
    assert rewards == [trl_peer.reward([i, i + 1, 7]) for i in range(50)]
    assert all(0 <= r < 1 for r in rewards) and len(set(rewards)) > 45


def test_means_leave_out_the_warm_up_and_the_table_gives_ratios():
    assert trl_peer.means([{"step": 100.0}, {"step": 2.0}, {"step": 4.0}]) == {"step": 3.0}
    runs = {"trl/on": {"mean": {"step": 10.0, "generation": 4.0, "machine_rss_mb": 3000.0}},
            "ours/on": {"mean": {"step": 5.0, "generation": 1.0, "sync": 0.5, "machine_rss_mb": 6000.0}}}
    rows = {line.split(" | ")[0].strip("| "): line for line in trl_peer.table(runs, ["on"]).splitlines()}
    assert rows["step (s)"] == "| step (s) | 10.00 | 5.00 | 0.50 |"
    assert rows["machine peak, sum of RSS (MB)"].endswith("| 3000 | 6000 | 2.00 |")
    assert rows["weight sync into vLLM (s)"] == "| weight sync into vLLM (s) | - | 0.50 |  |"

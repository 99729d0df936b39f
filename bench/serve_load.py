"""Load on one served environment (envs/openenv_serve.py): what a server of ours holds.

    python bench/serve_load.py [--envs babyai textcraft] [--sessions 8] [--episodes 1000] [--out FILE]

Per env, `python -m envs.openenv_serve --env E --sessions S` is started on 127.0.0.1, then:
  1. S concurrent WebSocket sessions (OpenEnv's message protocol, one asyncio client each) play whole
     episodes until `--episodes` have ended. The replies were recorded in-process first, on `--tasks`
     train tasks cycled: BabyAI's expert (episodes end solved), TextCraft a script (it has no expert:
     each listed crafting command, then `inventory`, cut at `--turns` as a rollout's turn budget would).
     Our tasks are deterministic, so every served episode must end with the recorded observation,
     reward and done: checked, a mismatch counted. Printed: episodes and steps per second, a step's round
     trip p50 / p99 (send to answer, as the client sees it), the server's RSS after 10 episodes and after
     all of them, and whether the growth is within `--rss-bound-mb`;
  2. with S sessions held mid-episode, `--extra` more connect: each refused (`CAPACITY_REACHED`) counts;
  3. those S clients drop mid-episode (the TCP connection cut, no close message), then S new sessions
     connect: all accepted means every dropped one was freed (the seconds that took are printed).
The clients run on the same cores as the server: the figures are the pair's, on this machine's CPU
(named in the output). docs/environments.md has them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import envs  # noqa: E402
from bench.machine import cpu_name  # noqa: E402

OPTIONS = {"babyai": {"brief": True}}


def cpu_flags() -> str:
    """The vector extensions the CPU has, of those that matter to the figures' readers."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "flags unknown"
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "no avx2"


def reply(action: str) -> str:
    return f"Thought:\nNext step.\n\nAction:\n{action}"


def record(name: str, tasks: list[int], turns: int) -> list[dict]:
    """Each task played in-process: its replies and how it ended (the served episode must end the same)."""
    env, out = envs.make(name, **OPTIONS.get(name, {})), []
    for task in tasks:
        obs, replies, end = env.reset(task), [], None
        script = [reply(line) for line in obs.splitlines() if line.startswith("craft ")] if name == "textcraft" else []
        for turn in range(turns):
            if name == "textcraft":
                text = script[turn // 2] if turn % 2 == 0 and turn // 2 < len(script) else reply("inventory")
            else:
                text = env.expert()
            replies.append(text)
            end = env.step(text)
            if end[2]:
                break
        out.append({"task": task, "replies": replies, "end": list(end)})
    env.close()
    return out


def wait_healthy(url: str, seconds: float = 300.0) -> None:
    """Until the server at `url` answers GET /health (importing OpenEnv's server takes a while on a busy machine)."""
    import requests
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/health", timeout=1).ok:
                return
        except requests.ConnectionError:
            time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Load:
    """One served env under S concurrent clients."""

    def __init__(self, url: str, server: psutil.Process, episodes: list[dict], total: int):
        self.url, self.server, self.episodes, self.total = url.replace("http", "ws") + "/ws", server, episodes, total
        self.started = self.ended = self.mismatches = 0
        self.latencies: list[float] = []
        self.rss: dict[int, float] = {}

    async def ask(self, ws, message: dict) -> dict:
        await ws.send(json.dumps(message))
        return json.loads(await ws.recv())

    async def client(self) -> None:
        from websockets.asyncio.client import connect

        async with connect(self.url, max_size=None) as ws:
            while self.started < self.total:
                episode = self.episodes[self.started % len(self.episodes)]
                self.started += 1
                answer = await self.ask(ws, {"type": "reset", "data": {"task_id": episode["task"]}})
                assert answer["type"] == "observation", answer
                for text in episode["replies"]:
                    start = time.perf_counter()
                    answer = await self.ask(ws, {"type": "step", "data": {"text": text}})
                    self.latencies.append(time.perf_counter() - start)
                data = answer["data"]
                self.mismatches += [data["observation"]["text"], data["reward"], data["done"]] != episode["end"]
                self.ended += 1
                if self.ended in (10, self.total):
                    self.rss[self.ended] = self.server.memory_info().rss / 2**20

    async def run(self, sessions: int) -> float:
        start = time.perf_counter()
        await asyncio.gather(*(self.client() for _ in range(sessions)))
        return time.perf_counter() - start

    async def cap_and_drops(self, sessions: int, extra: int, task: int) -> tuple[int, int, float]:
        """(sessions refused past the cap, sessions accepted after S clients dropped mid-episode, seconds
        until all were)."""
        from websockets.asyncio.client import connect

        held = [await connect(self.url) for _ in range(sessions)]
        for ws in held:  # mid-episode: a reset and a step
            await self.ask(ws, {"type": "reset", "data": {"task_id": task}})
            await self.ask(ws, {"type": "step", "data": {"text": reply("inventory")}})
        refused = 0
        for _ in range(extra):
            async with connect(self.url) as ws:
                answer = json.loads(await ws.recv())
                refused += answer.get("data", {}).get("code") == "CAPACITY_REACHED"
        for ws in held:
            ws.transport.abort()  # the client is gone: no close message
        start, accepted = time.perf_counter(), 0
        while time.perf_counter() - start < 30:
            fresh = [await connect(self.url) for _ in range(sessions)]
            answers = [await self.ask(ws, {"type": "reset", "data": {"task_id": task}}) for ws in fresh]
            accepted = sum(a["type"] == "observation" for a in answers)
            for ws in fresh:
                await ws.close()
            if accepted == sessions:
                break
            await asyncio.sleep(0.2)
        return refused, accepted, time.perf_counter() - start


def bench(name: str, args) -> dict:
    tasks = random.Random(args.seed).sample(envs.make(name, **OPTIONS.get(name, {})).tasks("train"), args.tasks)
    episodes = record(name, tasks, args.turns)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "envs.openenv_serve", "--env", name, "--port", str(port),
                             "--sessions", str(args.sessions), "--env-options", json.dumps(OPTIONS.get(name, {}))],
                            cwd=ROOT)
    try:
        wait_healthy(url)
        load = Load(url, psutil.Process(proc.pid), episodes, args.episodes)
        seconds = asyncio.run(load.run(args.sessions))
        refused, freed, free_s = asyncio.run(load.cap_and_drops(args.sessions, args.extra, tasks[0]))
        rss_end = load.server.memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait()
    growth = load.rss[args.episodes] - load.rss[10]
    return {"env": name, "sessions": args.sessions, "episodes": load.ended, "steps": len(load.latencies),
            "episodes_per_s": load.ended / seconds, "steps_per_s": len(load.latencies) / seconds,
            "step_p50_ms": 1000 * percentile(load.latencies, 0.5), "step_p99_ms": 1000 * percentile(load.latencies, 0.99),
            "mismatches": load.mismatches, "solved": sum(e["end"][2] for e in episodes) / len(episodes),
            "rss_after_10_mb": load.rss[10], f"rss_after_{args.episodes}_mb": load.rss[args.episodes],
            "rss_growth_mb": growth, "within_bound": growth <= args.rss_bound_mb, "rss_after_drops_mb": rss_end,
            "refused_past_cap": f"{refused}/{args.extra}", "freed_after_drop": f"{freed}/{args.sessions}",
            "freed_in_s": free_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", nargs="+", default=["babyai", "textcraft"])
    ap.add_argument("--sessions", type=int, default=8, help="the server's cap, and the concurrent clients")
    ap.add_argument("--episodes", type=int, default=1000, help="episodes played in all (at least 10)")
    ap.add_argument("--tasks", type=int, default=100, help="distinct train tasks, recorded once and cycled")
    ap.add_argument("--turns", type=int, default=30, help="turn cap of an episode")
    ap.add_argument("--extra", type=int, default=4, help="connections tried past the cap")
    ap.add_argument("--rss-bound-mb", type=float, default=32.0, help="the largest RSS growth from 10 episodes to all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    if args.episodes < 10:
        raise SystemExit("error: --episodes must be at least 10 (the RSS is read after 10 episodes and after all)")
    rows = [bench(name, args) for name in args.envs]
    machine = {"cpu": cpu_name(), "flags": cpu_flags(), "cores": os.cpu_count(), "load_average_end": os.getloadavg()[0]}
    print(f"\nCPU: {machine['cpu']} ({machine['flags']}), {machine['cores']} cores; server and clients on the same "
          f"cores; load average {machine['load_average_end']:.1f} at the end\n")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**machine, "command": " ".join(sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

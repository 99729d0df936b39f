"""The multi-turn POMDP rollout: many episodes of a text environment played at once, turn by turn.

Paper, section 2 (the agent-environment loop): at each turn the policy reads the whole history and
emits a thought and an action; the environment answers with an observation, a reward and a done flag,
until done or the turn budget of the horizon schedule (ScalingInter-RL) runs out.

`rollout()` opens every episode from its env's reset (`begin`), then each turn:
  1. the actor replies to every live episode (`replies`): one batched `engine.generate` (the prompt is the
     episode's token ids), or, for the warm start's demonstrations, the env's own solver (`Expert`);
  2. the env steps of those episodes run concurrently in a thread pool (results kept in order);
  3. each answer goes into its episode (`observe`): the observation appended as tokens, unless it ended.

Token-exact bookkeeping (docs/design.md): the ids the sampler produced are the ids that are trained on,
end-of-turn token included; the history is never decoded and re-encoded. Observation tokens come
from rendering the model's own chat template around placeholders and taking the text that follows a
closed assistant turn (`ChatFormat`), so HF chat templates work, not only ChatML, including those that
rewrite earlier turns (Qwen3, DeepSeek-R1 distills). `mask` is 1 exactly on sampled tokens.
The episode's reward is the env's last reward and belongs on the last sampled token (`reward_index`);
the original put it on an observation token that the loss mask excluded.

Departures from the original: episodes end cleanly at a context-length cap; an env that raises, or
whose reset or step has not returned after `env_timeout` seconds (a hung simulator, a page that never
loads), is flagged `env_error` and replaced, while the other episodes go on. A hung call's thread cannot
be stopped from Python; it is abandoned (counted in `abandoned()`), and train.py / evaluate.py then end
their process without waiting for it.
"""
from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from infra import faults
from infra.envcalls import abandoned, calls, replace_env
from engine import Sample, Sampling, stop_ids
from envs import has_action
from infra.framing import Framing
from infra.stepplan import per_rank
from studies.gigpo import state_key

REPLY, OBS = "<<REPLY-PLACEHOLDER>>", "<<OBSERVATION-PLACEHOLDER>>"


def template_variables(source, options: dict) -> set[str]:
    """The variables a Jinja chat template reads from outside (`options`' names when it cannot be parsed
    here, e.g. a template with transformers' own tags: then nothing is refused)."""
    import jinja2
    from jinja2 import meta

    try:
        return meta.find_undeclared_variables(jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source))
    except (jinja2.TemplateError, TypeError):
        return set(options)


class ChatFormat:
    """Turns chat messages into token ids through the tokenizer's own chat template.

    An episode's tokens are what the model saw: the first prompt (the template's rendering of the opening
    and the first observation, generation prompt included), then per turn the sampled reply (its
    end-of-turn token included) and the template's delta after a closed assistant turn: the rest of the
    turn's close, the observation as a user turn and the next generation prompt (Qwen3 with
    `enable_thinking=False`: an empty `<think>` block, which the model saw before its reply).

    Templates that rewrite earlier turns work as well as append-only ones. Qwen3 renders the last assistant
    turn with a `<think>` block that the same turn loses once a user turn follows; DeepSeek-R1 distills drop
    earlier reasoning. The delta is read after an assistant turn in the form it keeps in the history (a
    user turn after it), so no rewrite enters it; the episode keeps every reply as sampled, reasoning
    included: that is what the model saw when it wrote its next reply, and what is trained. A template whose
    delta is not one constant text (it depends on the turn's position, or text before the last assistant
    turn changes as turns are added) is refused with the reason.
    """

    def __init__(self, tokenizer, model_dir: str | None = None, template_options: dict | None = None):
        self.tok = tokenizer
        self.options = dict(template_options or {})  # passed to the template, e.g. {"enable_thinking": False}
        unread = sorted(set(self.options) - template_variables(tokenizer.chat_template, self.options)) if self.options else []
        if unread:  # a misspelt option would change nothing, silently
            raise ValueError(f"the chat template reads no {', '.join(unread)}: drop it from --chat-template-options "
                             "(or check its spelling against the model's tokenizer_config.json)")
        reply, obs = (lambda k: f"{REPLY[:-2]}-{k}>>"), (lambda k: f"{OBS[:-2]}-{k}>>")
        convo = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        for k in (1, 2):
            convo += [{"role": "assistant", "content": reply(k)}, {"role": "user", "content": obs(k)}]
        closed = self.render(convo[:3], generation_prompt=False)  # turn 1 while it is the last message
        one, two = self.render(convo[:4]), self.render(convo)     # turn 1 (and 2) as they stay in the history
        for text, marks in ((closed, [reply(1)]), (one, [reply(1), obs(1)]), (two, [reply(1), obs(1), reply(2), obs(2)])):
            if any(text.count(mark) != 1 for mark in marks):
                self.refuse("it does not render each message's content exactly once")
        close = closed.split(reply(1))[1]                     # e.g. "<|im_end|>\n"
        delta = one.split(reply(1))[1]                        # close, user turn, generation prompt
        if not delta.startswith(close):
            self.refuse(f"an assistant turn closes with {close!r} as the last message, but not once a user turn follows")
        if two.split(reply(1))[0] != one.split(reply(1))[0] or not two.split(reply(1))[1].startswith(delta.split(obs(1))[0]):
            self.refuse("text before the last assistant turn changes when a turn is added")
        if two.split(reply(2))[1] != delta.replace(obs(1), obs(2)):
            self.refuse("the text after an assistant turn depends on the turn's position")
        self.obs_open, self.obs_close = delta[len(close):].split(obs(1))
        eos = tokenizer.eos_token or ""
        if not eos or not close.startswith(eos):
            raise ValueError(f"the template closes an assistant turn with {close!r}, which does not start with "
                             f"the tokenizer's eos token {eos!r}; set eos_token to the end-of-turn token")
        self.eos_id = tokenizer.eos_token_id                 # the template's end of turn
        # Every end-of-generation id the model declares stops a reply (vLLM stops on them anyway; the HF
        # engine and the "did it stop" test below must know them too), the template's own first.
        self.stop_ids = stop_ids(tokenizer, model_dir)
        self.close_after_stop = close[len(eos):]             # what follows the sampled stop token, e.g. "\n"
        self.close = close                                    # what closes a turn cut off by a token cap

    @staticmethod
    def refuse(reason: str):
        raise ValueError(f"this chat template cannot be played token-exactly: {reason}; use a template whose "
                         "text after an assistant turn is the same at every turn (Qwen2.5, Qwen3, Llama 3, ChatML)")

    def render(self, messages: list[dict], generation_prompt: bool = True) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                            **self.options)

    def encode(self, text: str, plain: bool = False) -> list[int]:
        # plain=True: special-token strings inside env text stay text (no role injection from observations)
        return self.tok(text, add_special_tokens=False, split_special_tokens=plain)["input_ids"]

    def prompt(self, instruction: str, first_observation: str, acknowledgement: str | None = None) -> list[int]:
        """The first prompt: the opening turns (`opening`), the first observation as a user turn, the
        assistant header. With an acknowledgement (AgentGym's framing) the instruction is a user turn and
        the acknowledgement a canned assistant turn, both prompt tokens (never trained on)."""
        messages = opening(instruction, acknowledgement) + [{"role": "user", "content": OBS}]
        head, tail = self.render(messages).split(OBS)
        return self.encode(head) + self.encode(first_observation, plain=True) + self.encode(tail)

    def observation(self, text: str, stopped: bool) -> list[int]:
        """Tokens after a sampled reply: close the assistant turn, the user turn, the next assistant header.
        `stopped`: the reply ended with the template's own end-of-turn token, so only what follows it is
        added; a reply cut by its token cap, or ended by another declared eos, gets the full close."""
        head = (self.close_after_stop if stopped else self.close) + self.obs_open
        return self.encode(head) + self.encode(text, plain=True) + self.encode(self.obs_close)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def opening(instruction: str, acknowledgement: str | None = None) -> list[dict]:
    """The messages before the first observation: the instruction as the system message, or, with an
    acknowledgement (infra/framing.py, AgentGym's style), as a user turn followed by the canned assistant turn."""
    if acknowledgement is None:
        return [{"role": "system", "content": instruction}]
    return [{"role": "user", "content": instruction}, {"role": "assistant", "content": acknowledgement}]


@dataclass
class Episode:
    task_id: int
    group: int                  # episodes sampled for the same task share a group (GRPO/RLOO baselines)
    ids: list[int]              # prompt, then assistant and observation tokens
    prompt_len: int
    mask: list[int] = field(default_factory=list)         # over ids[prompt_len:]: 1 on sampled tokens
    logprobs: list[float] = field(default_factory=list)   # over ids[prompt_len:]: sampler logprob, 0 elsewhere
    reward: float = 0.0         # last env reward, scaled to [-1, 1]
    best: float = 0.0           # the highest reward after any turn (a running score's best; batch.REWARDS "best")
    success: bool = False
    turns: int = 0
    refused: int = 0            # turns whose action the env did not carry out (its `refused` flag)
    cut: int = 0                # replies their token cap cut off (--max-tokens, or the room left in the context)
    cut_before_action: int = 0  # of those, replies with no `Action:` line yet (the reply format the envs ask for)
    end: str = ""               # done | horizon | context | env_error
    error: str = ""
    messages: list[dict] = field(default_factory=list)    # the transcript, for logs
    states: list[str] = field(default_factory=list)       # per turn, the key of the observation it answered (studies/gigpo.py)

    @property
    def response(self) -> list[int]:
        return self.ids[self.prompt_len:]

    @property
    def reward_index(self) -> int:
        """Index into `response` of the last sampled token, where the reward belongs (-1 if none)."""
        return max((i for i, m in enumerate(self.mask) if m), default=-1)

    def append(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.mask += [int(sampled)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def reply_seed(seed: int, episode: int, turn: int) -> int:
    """The sampling seed of one reply: a 63-bit hash of (seed, the episode's index among all the episodes
    played with `seed`, turn). A per-rank `seed + i` would give rank r's prompt i+1 and rank r+1's prompt
    i one seed, and when a task's group spans both ranks, one task: GRPO would compare near-identical
    samples (vLLM seeds each request on its own). Hashed, no two replies of a step share a seed."""
    digest = hashlib.blake2b(f"{seed}/{episode}/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(frozen=True)
class Play:
    """How episodes are played: the one settings object of training, validation, evaluation and the
    expert's demonstrations. `seed` None: unseeded; else reply t of the episode with global index e is
    sampled with `reply_seed(seed, e, t)`. `env_timeout`: seconds an env call may run before its episode
    is flagged `env_error` (None: no limit)."""
    max_turns: int
    max_tokens: int = 256
    max_context: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    framing: Framing = Framing()
    env_timeout: float | None = None
    states: bool = False  # record each turn's state key (Episode.states): only GiGPO reads them (Algo.states)


@dataclass
class Playground:
    """What plays a rank's episodes: the settings (config.Config, launch.checks.Derived), this rank's place
    among the ranks, its generator, envs and the pool that steps them, the chat format, the train tasks.
    The training run (launch.startup.Run) is one, with what a step also keeps; the studies read only this."""
    cfg: object
    d: object                    # the schedule's budgets, the framing, the algorithm record
    rank: int
    world: int
    engine: object               # this rank's generator (engine.py)
    env_pool: list               # one environment per episode of this rank's share of a step
    make_env: Callable           # builds a replacement environment (a hung or crashed simulator)
    threads: ThreadPoolExecutor  # steps the environments concurrently
    chat: ChatFormat             # records each episode token-exactly
    tokenizer: object
    train_ids: list

    @property
    def per_rank(self) -> int:
        """This rank's episodes of a step: its share of every group (infra/stepplan.rank_share)."""
        return per_rank(self.cfg.tasks_per_step, self.cfg.samples_per_task, self.world)

    def play(self, turns: int, seed: int | None) -> Play:
        """How this run plays episodes at a turn budget and seed."""
        c = self.cfg
        return Play(turns, c.max_tokens, c.max_context, c.temperature, c.top_p, seed, self.d.framing,
                    c.env_timeout or None, states=self.d.algo.states)


class Expert:
    """The env's own solver as the actor (BabyAI's bot, the MiniWoB++ scripts, SciWorld's gold path): each
    live episode's env names its next action, recorded as a sampled reply would be (its text's tokens and
    the end-of-turn token), so a demonstration is played by the same loop as an RL episode. A solver that
    raises ends its episode as `expert_error`, one failed demonstration, never the run (minigrid's bot
    raises a TypeError on some tasks); a reply longer than the context left ends it as `context`."""

    def __init__(self, chat: ChatFormat):
        self.chat = chat

    def replies(self, envs: list, caps: list[int], pool: ThreadPoolExecutor, timeout: float | None) -> list[Sample]:
        out = []
        for (text, err), cap in zip(calls(pool, [(env.expert,) for env in envs], timeout), caps):
            ids = [] if err else self.chat.encode(text) + list(self.chat.stop_ids[:1])
            end = "expert_error" if err else "context" if len(ids) > cap else ""
            out.append(Sample(ids, None, text, end, err or ""))
        return out


@dataclass
class Game:
    """What every part of one `rollout` call reads: the actor that replies, the chat format that records each
    episode token-exactly, the envs (episode i on envs[i]), how episodes are played and the threads that
    step the envs."""
    actor: object
    chat: ChatFormat
    envs: list
    make_env: Callable[[], object]
    play: Play
    pool: ThreadPoolExecutor
    first: int = 0  # the index of envs[0]'s episode among all the episodes played with `play.seed`

    def replace(self, i: int, err: str) -> None:
        """Env i raised or hung (`err`): a fresh one from `make_env` in its place, in the caller's list."""
        self.envs[i] = replace_env(self.envs[i], self.make_env, hung=err.startswith("TimeoutError"))


def info(env) -> dict:
    """The env's own report on its last reset or step for the transcript (`env.info`, e.g. an OpenEnv
    observation's metadata), as {"info": ...}; nothing when the env has none."""
    return {"info": env.info} if getattr(env, "info", None) else {}


def rollout(actor, chat: ChatFormat, envs: list, make_env: Callable[[], object], tasks: list[tuple[int, int]],
            play: Play, pool: ThreadPoolExecutor | None = None, first: int = 0):
    """Play one episode per (task_id, group) in `tasks`, the i-th on `envs[i]`, `play` deciding the budget,
    the sampling and how each episode opens (infra/framing.py). `actor`: an engine (engine.py) or an `Expert`.
    `first`: the index of `tasks[0]` among all the episodes played with `play.seed` (on every rank).

    Returns (episodes, timing) with timing seconds for "generate", "env" and "other" (our bookkeeping).
    `envs[i]` is replaced in place by `make_env()` when it raised, so the caller's pool stays usable.
    """
    if len(envs) < len(tasks):
        raise ValueError(f"{len(tasks)} episodes need as many env instances; got {len(envs)}")
    own_pool, abandoned_before = pool is None, abandoned()
    pool = pool or ThreadPoolExecutor(max_workers=min(32, len(tasks)) or 1)
    timing = {"generate": 0.0, "env": 0.0, "other": 0.0}
    start, game = time.perf_counter(), Game(actor, chat, envs, make_env, play, pool, first)

    t = time.perf_counter()
    firsts = calls(pool, [(envs[i].reset, tasks[i][0]) for i in range(len(tasks))], play.env_timeout)
    timing["env"] += time.perf_counter() - t
    episodes = [begin(game, task, result, i) for i, (task, result) in enumerate(zip(tasks, firsts))]

    for turn in range(play.max_turns):
        live = [i for i, ep in enumerate(episodes) if not ep.end]
        if not live:
            break
        t = time.perf_counter()
        samples = replies(game, episodes, live, turn)
        timing["generate"] += time.perf_counter() - t
        faults.point("rollout_turn")  # test-only crash point (faults.py): a no-op unless TRAIN_FAULT names it

        acted = []
        for i, s in zip(live, samples):
            if s.end:  # the actor could not reply (the expert's own failure): the episode ends here
                episodes[i].end, episodes[i].error = s.end, s.error
                continue
            text = chat.decode(s.ids) if s.text is None else s.text
            episodes[i].append(s.ids, True, s.logprobs)
            episodes[i].turns += 1
            episodes[i].messages.append({"role": "assistant", "content": text})
            if not (s.ids and s.ids[-1] in chat.stop_ids):  # no end-of-turn token: the cap stopped it
                episodes[i].cut += 1
                episodes[i].cut_before_action += not has_action(text)
            acted.append((i, s, text))
        t = time.perf_counter()
        results = calls(pool, [(envs[i].step, text) for i, _, text in acted], play.env_timeout)
        timing["env"] += time.perf_counter() - t
        for (i, s, _), result in zip(acted, results):
            observe(game, episodes[i], result, i, s, last=turn + 1 == play.max_turns)
    for ep in episodes:
        ep.end = ep.end or "horizon"
        del ep.states[ep.turns:]  # an observation no turn answered (the context was full) is no state of a turn
    if own_pool:  # not waiting for a thread that is stuck in an env call
        pool.shutdown(wait=abandoned() == abandoned_before)
    timing["other"] = time.perf_counter() - start - timing["generate"] - timing["env"]
    return episodes, timing


def begin(game: Game, task: tuple[int, int], result, i: int) -> Episode:
    """Episode i opened from its env's reset `result` ((observation, None) or (None, error)): the framing's
    instruction, the first observation as the prompt; an env that raised is flagged and replaced."""
    (task_id, group), (obs, err), play = task, result, game.play
    instruction, acknowledgement = play.framing.opening(game.envs[i]) if err is None else ("", None)
    ep = Episode(task_id, group, [], 0, messages=opening(instruction, acknowledgement))
    if err is not None:
        ep.end, ep.error = "env_error", err
        game.replace(i, err)
        return ep
    ep.ids = game.chat.prompt(instruction, obs, acknowledgement)
    ep.prompt_len = len(ep.ids)
    ep.messages.append({"role": "user", "content": obs} | info(game.envs[i]))
    if play.states:
        ep.states.append(state_key(obs))
    if ep.prompt_len >= play.max_context:
        ep.end = "context"
    return ep


def replies(game: Game, episodes: list[Episode], live: list[int], turn: int) -> list[Sample]:
    """The actor's replies to the live episodes (`live`: their places; episode i is the play's
    `game.first + i`), each capped by the reply budget and the room left in the context: one batched
    generation, or the expert's moves."""
    actor, play = game.actor, game.play
    caps = [min(play.max_tokens, play.max_context - len(episodes[i].ids)) for i in live]
    if isinstance(actor, Expert):
        return actor.replies([game.envs[i] for i in live], caps, game.pool, play.env_timeout)
    seeds = None if play.seed is None else [reply_seed(play.seed, game.first + i, turn) for i in live]
    return actor.generate([episodes[i].ids for i in live],
                          Sampling(caps, play.temperature, play.top_p, seeds, game.chat.stop_ids))


def observe(game: Game, ep: Episode, result, i: int, s: Sample, last: bool) -> None:
    """The env's answer to episode i's reply `s` (((obs, reward, done), None) or (None, error)) into the
    episode: its reward, success and refusals, and either its end (done, the turn budget, a full context,
    an env error: the env replaced) or the observation's tokens for the next turn."""
    (step, err), env, play = result, game.envs[i], game.play
    if err is None and getattr(env, "crashed", False):
        err = getattr(env, "error", None) or "simulator crashed"
    if err is not None:
        ep.end, ep.error = "env_error", err
        game.replace(i, err)
        return
    obs, ep.reward, done = step
    ep.messages[-1].update(info(env))  # what the env reported about this reply's step
    ep.best = max(ep.best, ep.reward)
    ep.success = bool(getattr(env, "success", False))
    ep.refused += bool(getattr(env, "refused", False))
    if done or last:
        ep.end = "done" if done else "horizon"
        return
    obs_ids = game.chat.observation(obs, stopped=bool(s.ids) and s.ids[-1] == game.chat.eos_id)
    if len(ep.ids) + len(obs_ids) >= play.max_context:  # no room left for another reply
        ep.end = "context"
        return
    ep.append(obs_ids, False)
    ep.messages.append({"role": "user", "content": obs})
    if play.states:
        ep.states.append(state_key(obs))


def play_rounds(actor, chat: ChatFormat, envs: list, make_env: Callable[[], object], tasks: list[tuple[int, int]],
                play: Play, pool: ThreadPoolExecutor | None = None, first: int = 0) -> list[Episode]:
    """`rollout` over any number of tasks, in rounds of at most len(envs) episodes (task j on envs[j %
    len(envs)]); the seeds follow each episode's index from `first`, as in one call."""
    episodes = []
    for i in range(0, len(tasks), len(envs)):
        episodes += rollout(actor, chat, envs, make_env, tasks[i:i + len(envs)], play, pool, first + i)[0]
    return episodes

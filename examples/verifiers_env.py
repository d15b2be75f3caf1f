#!/usr/bin/env python3
"""Run an environment written with Prime Intellect's `verifiers` library (the classic API:
`vf.Environment`, `SingleTurnEnv`, `MultiTurnEnv`, `ToolEnv`, a `Rubric` of reward functions,
`load_environment(...)` per environment package), unchanged, as an rlvr environment program
(docs/DESIGN.md section 14: `hello`, `reset`, `step`, `finish` in JSON lines).

    [env]
    verifiers = "reverse-text"            # the environment id, as prime-rl's [[orchestrator.env]] id
    env_args = { num_train_examples = 2000 }   # load_environment's keyword arguments (prime-rl's args)

is the shorthand of

    [env]
    command = ["python3", "examples/verifiers_env.py"]
    options = { env_id = "reverse-text", env_args = { num_train_examples = 2000 } }

Supported: verifiers 0.3.1 (`pip install verifiers==0.3.1`), whose classic stack answers at
`import verifiers as vf`, and verifiers 0.4.0, which ships only the `verifiers.v1` stack
(tasksets, harnesses, runtimes; `V1Adapter` below: each model call the harness makes reaches an
OpenAI-compatible endpoint this program serves and is one rlvr turn). `hello` picks the one the
installed package has. Guide: docs/coming-from-prime-rl.md.

How a 0.3.1 episode runs. The environment's own rollout loop runs (`env.rollout(input, client,
model, sampling_args)`, its `setup_state`, stop conditions, `env_response`, tools and cleanups),
with a client that does not call a model: each time the loop asks the client for a response, the
episode pauses and rlvr samples the turn. So

- `reset` starts the rollout and answers with the prompt the loop first asks about (`messages`, or
  `dialogue` when it holds assistant turns, such as few-shot examples) and the episode's tools
  (`state["tool_defs"]` as OpenAI function schemas);
- `step` hands the loop the model's turn as the response (`text` as the assistant message's
  content; `tool_calls` as its tool calls, with rlvr's ids `call_0`, ... and the arguments as a
  JSON string; with parsed calls and no unparsed ones, the content is the text before the first
  `<tool_call>`, as vLLM's Hermes parser gives it) and answers with what the loop asks about next:
  the messages the environment added (`env_response`'s tool results or user turns), `done` false;
  or, when a stop condition ends the rollout, `done` true, the rubric's reward and the
  environment's `final_env_response` (if any) as the messages;
- `finish` (rlvr ended the episode: max_turns, length, budget, eos) ends the rollout as verifiers
  ends one whose context ran out (the client raises `vf.OverlongPromptError`: `prompt_too_long`,
  `is_truncated`), then scores it; reason `error` cancels it unscored.

The reward is the environment's rubric's (`env.rubric.score_rollout(state)`: the weighted sum of
its reward functions, metrics weight 0), then `env.rubric.cleanup(state)`, as verifiers'
`run_rollout` scores a rollout. Each reward function's score (`state["metrics"]`, weight-0
metrics included) and the weighted reward (as `reward`, unless a function has that name) go with
the episode's last reply as its `metrics` (rlvr logs `env/metrics/<name>/mean` per step, as
prime-rl logs each function): finite numbers only (a boolean as 1 or 0; anything else, a name of
more than 128 bytes, and names past the first 64 in name order are left out, said on stderr).
Each scored episode also writes one line to stderr (the run's `env.stderr`):
`[verifiers] episode ID reward R metrics {"name": value, ...}`.

Errors become episode errors (the episode is unscorable) naming the environment and the function:
an exception the rollout raises, an error verifiers records in `state["error"]` (a tool call that
stops the rollout, `env_response` failing), and a reward function that raises (verifiers would log
it and score 0; here it is an error, so a broken reward function is not read as a wrong answer).
A rubric with group reward functions (`has_group_rewards`) is refused at `hello`: rlvr needs each
episode's reward when it ends, before its group's other episodes have ended.

Data. rlvr's `data.train` rows reach `reset` as `row`. A row with `example_id` picks that example of
the environment's own dataset (`env.get_dataset()`, or `get_eval_dataset()` with option
`split = "eval"`), formatted by verifiers (system prompt, few-shot, its `prompt` column). Write
such a file with

    python3 examples/verifiers_env.py export --env-id ID [--env-args JSON] [--split eval] --out F.jsonl

(one line per example: `example_id`, `question` (the last user message, for rlvr's own
rendering and display), `answer`, `info` as JSON text). A row without `example_id` is the input
itself: `prompt` (a JSON list of messages) or `question` (made into messages with the
environment's `system_prompt` and `few_shot`, as verifiers formats a dataset), `answer` (else
rlvr's `reference`) and `info` (JSON object text).

Options (the `hello` table): `env_id` (required), `env_args` (object), `split` (`train` or `eval`),
`paths` (directories put in front of `sys.path`, for an environment module that is not installed),
`model` (the name the environment sees, default `rlvr`); for 0.4.0 also `env_config` (the v1 env
config: agent, harness, runtime), with `env_args` its taskset's config and no `split`.

Each rollout step runs with Python's `random` seeded from the episode's seed, sample and turn, so
an environment that draws from it replays identically after a restart.
"""
import asyncio
import concurrent.futures
import json
import logging
import math
import os
import queue
import random
import re
import sys
import sysconfig
import threading
import time
import traceback
import unicodedata
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROTOCOL = 1
SUPPORTED = "0.3.1"
SUPPORTED_V1 = "0.4.0"

# The protocol's stdout is kept; everything else the environment prints goes to stderr (the log).
OUT = sys.stdout
sys.stdout = sys.stderr

vf = None  # the verifiers module, imported at hello


def send(obj):
    OUT.write(json.dumps(obj) + "\n")
    OUT.flush()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class EpisodeError(Exception):
    """An episode that cannot go on; its message becomes the episode's `error`."""


def where(exc):
    """`function (file:line)` of the innermost frame of `exc`'s traceback, following its causes."""
    seen = set()
    while exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    f = frames[-1]
    return f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})"


def describe(exc):
    """`Type: message` of `exc` and of what caused it."""
    parts = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__
    return " <- ".join(parts)


def text_of(content, what):
    """A message's content as a string: text parts joined; images are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
            text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
            if kind == "text" and isinstance(text, str):
                out.append(text)
            else:
                raise EpisodeError(f"{what} has a {kind!r} content part; rlvr's messages are text")
        return "".join(out)
    raise EpisodeError(f"{what}'s content is a {type(content).__name__}, not text")


def get(m, key):
    return m.get(key) if isinstance(m, dict) else getattr(m, key, None)


# rlvr's bounds on one reply's metrics (crates/rlvr-env/src/protocol.rs: MAX_METRICS,
# MAX_METRIC_NAME_BYTES): a reply over them would stop the run.
MAX_METRICS = 64
MAX_METRIC_NAME_BYTES = 128


def wire_metrics(eid, metrics, reward):
    """The episode's `metrics` for rlvr: each finite numeric score by name (a boolean as 1 or 0),
    then the weighted reward as `reward` unless a function has that name; what rlvr would refuse
    (another value, a name empty, too long or with control characters, past the first
    MAX_METRICS names in name order) is left out and said on stderr."""
    out, left = {}, []
    for k, v in metrics.items():
        if isinstance(v, bool):
            v = float(v)
        ok_name = (isinstance(k, str) and 0 < len(k.encode()) <= MAX_METRIC_NAME_BYTES
                   and not any(unicodedata.category(c) == "Cc" for c in k))
        if ok_name and isinstance(v, (int, float)) and math.isfinite(v):
            out[k] = v
        else:
            left.append(k)
    out.setdefault("reward", reward)
    names = sorted(out)
    left += names[MAX_METRICS:]
    if left:
        log(f"[verifiers] episode {eid}: metrics left out (not a finite number, a bad name, or "
            f"past the first {MAX_METRICS}): {sorted(map(str, left))}")
    return {k: out[k] for k in names[:MAX_METRICS]}


def wire_message(m, what):
    """A verifiers message as the protocol's `{role, content, [tool_call_id], [tool_calls]}`."""
    role = get(m, "role")
    out = {"role": role, "content": text_of(get(m, "content"), what)}
    if role == "tool":
        out["tool_call_id"] = get(m, "tool_call_id")
    calls = get(m, "tool_calls") if role == "assistant" else None
    if calls:
        out["tool_calls"] = [
            {"id": get(c, "id"), "type": "function",
             "function": {"name": get(c, "name"), "arguments": get(c, "arguments")}}
            for c in calls
        ]
    return out


def tool_schemas(tool_defs):
    """verifiers' provider-agnostic tools as the OpenAI function schemas chat templates read."""
    out = []
    for t in tool_defs or []:
        fn = {"name": get(t, "name"), "description": get(t, "description") or "",
              "parameters": get(t, "parameters") or {"type": "object", "properties": {}}}
        out.append({"type": "function", "function": fn})
    return out


class Episode:
    """One rollout of the environment's own loop, paused whenever it asks for a model turn."""

    def __init__(self, adapter, eid, seed, sample):
        self.adapter = adapter
        self.id = eid
        self.seed = seed
        self.sample = sample
        self.turn = 0
        self.asked = asyncio.Queue()   # ("ask", prompt) | ("done", state) | ("raised", exc)
        self.answers = asyncio.Queue()  # a vf.Response, or CLOSE
        self.prompt = None              # the messages of the last ask
        self.tools = []                 # the tools of the last ask, as OpenAI schemas
        self.task = None
        self.client = None


CLOSE = object()


def make_client_class():
    """A `vf.Client` whose responses come from rlvr: one instance per episode."""

    class RlvrTurnClient(vf.Client):
        def __init__(self, episode):
            super().__init__(None)
            self.episode = episode

        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kw):
            raise NotImplementedError

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

        async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            ep = self.episode
            ep.tools = tool_schemas(tools)
            await ep.asked.put(("ask", list(prompt)))
            answer = await ep.answers.get()
            if answer is CLOSE:
                raise vf.OverlongPromptError("rlvr ended the episode (finish)")
            return answer

    return RlvrTurnClient


class RewardErrorCatcher(logging.Handler):
    """Records verifiers' 'Error calling reward function NAME: ...' log lines during scoring."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages = []

    def emit(self, record):
        msg = record.getMessage()
        if "reward function" in msg:
            self.messages.append(msg)


def make_adapter(options):
    """The adapter for the installed verifiers: the classic API's (`verifiers.load_environment`,
    0.3.1) or the v1 stack's (`verifiers.v1`, 0.4.0)."""
    env_id = options.get("env_id")
    if not isinstance(env_id, str) or not env_id:
        raise ValueError("option env_id (the verifiers environment id, env.verifiers) is "
                         "required")
    args = options.get("env_args") or {}
    if not isinstance(args, dict):
        raise ValueError(f"option env_args must be a table, not {type(args).__name__}")
    for p in reversed(options.get("paths") or []):
        sys.path.insert(0, os.path.abspath(p))
    try:
        import verifiers
    except ImportError as e:
        raise ValueError(f"cannot import verifiers ({e}): pip install verifiers=={SUPPORTED} "
                         f"or verifiers=={SUPPORTED_V1} into the Python that runs this "
                         "environment (env.python)") from e
    version = getattr(verifiers, "__version__", "?")
    if hasattr(verifiers, "load_environment"):
        return Adapter(options, verifiers, version)
    try:
        import verifiers.v1 as v1
    except ImportError as e:
        raise ValueError(
            f"verifiers {version} has neither the classic API (load_environment) nor the v1 "
            f"stack (verifiers.v1: {e}); rlvr's adapter supports verifiers {SUPPORTED} and "
            f"{SUPPORTED_V1}") from e
    return V1Adapter(options, v1, version)


class Adapter:
    def __init__(self, options, verifiers, version):
        global vf
        self.env_id = options["env_id"]
        args = options.get("env_args") or {}
        self.split = options.get("split", "train")
        if self.split not in ("train", "eval"):
            raise ValueError(f"option split is {self.split!r}; it is train or eval")
        self.model = options.get("model", "rlvr")
        vf = verifiers
        self.version = version
        if version != SUPPORTED:
            log(f"[verifiers] warning: verifiers {version} installed; the adapter is tested "
                f"with {SUPPORTED}")
        try:
            self.env = vf.load_environment(self.env_id, **args)
        except Exception as e:
            raise ValueError(f"verifiers environment {self.env_id!r}: load_environment failed: "
                             f"{describe(e)} in {where(e)}") from e
        if getattr(self.env.rubric, "has_group_rewards", False):
            raise ValueError(
                f"verifiers environment {self.env_id!r}: its rubric has group reward functions, "
                "which score a group's rollouts together; rlvr needs each episode's reward when it "
                "ends, so they are not supported")
        self.client_class = make_client_class()
        self.examples = None
        self.episodes = {}
        self.catcher = RewardErrorCatcher()
        logging.getLogger("verifiers").addHandler(self.catcher)

    def name(self):
        return f"verifiers environment {self.env_id!r}"

    # ----- inputs -----

    def dataset(self):
        if self.examples is None:
            ds = self.env.get_eval_dataset() if self.split == "eval" else self.env.get_dataset()
            self.examples = {}
            for i, row in enumerate(ds):
                row = dict(row)
                self.examples[int(row.get("example_id", i))] = row
        return self.examples

    def input_of(self, row):
        if row.get("example_id") not in (None, ""):
            try:
                key = int(str(row["example_id"]))
            except ValueError:
                raise EpisodeError(f"row's example_id {row['example_id']!r} is not an integer")
            ex = self.dataset().get(key)
            if ex is None:
                raise EpisodeError(f"{self.name()} has no example_id {key} in its {self.split} "
                                   "dataset")
            return ex
        prompt = row.get("prompt")
        if isinstance(prompt, str) and prompt.lstrip().startswith("["):
            try:
                prompt = json.loads(prompt)
            except json.JSONDecodeError:
                pass
        if not isinstance(prompt, list):
            question = row.get("question", prompt)
            if not isinstance(question, str):
                raise EpisodeError("row has neither example_id, nor prompt messages, nor question")
            prompt = []
            if getattr(self.env, "system_prompt", None):
                prompt.append({"role": "system", "content": self.env.system_prompt})
            prompt.extend(getattr(self.env, "few_shot", None) or [])
            prompt.append({"role": "user", "content": question})
        inp = {"prompt": prompt, "example_id": 0,
               "answer": row.get("answer", row.get("reference", ""))}
        info = row.get("info")
        if isinstance(info, str) and info.strip():
            try:
                inp["info"] = json.loads(info)
            except json.JSONDecodeError:
                raise EpisodeError("row's info is not JSON text")
        elif isinstance(info, dict):
            inp["info"] = info
        return inp

    def export_rows(self):
        """The dataset as rlvr rows: `example_id`, `question`, `answer`, `info` (JSON text)."""
        for key, ex in sorted(self.dataset().items()):
            prompt = ex.get("prompt") or []
            users = [m for m in prompt if get(m, "role") == "user"]
            question = text_of(get(users[-1], "content"), "prompt") if users else ""
            info = ex.get("info")
            row = {"example_id": key, "question": question, "answer": str(ex.get("answer", ""))}
            if info not in (None, "", {}):
                row["info"] = info if isinstance(info, str) else json.dumps(info, default=str)
            yield row

    def close(self):
        """Cancels the rollouts still paused, so their cleanups run."""
        if not self.episodes:
            return
        loop = asyncio.get_event_loop()
        for eid in list(self.episodes):
            loop.run_until_complete(self.drop(eid))

    def handle(self, kind, episodes):
        """One protocol request's episodes answered in order, or None for an unknown `kind`."""
        fn = {"reset": self.reset_one, "step": self.step_one,
              "finish": self.finish_one}.get(kind)
        if fn is None:
            return None
        return asyncio.get_event_loop().run_until_complete(self.each(fn, episodes))

    # ----- driving the rollout -----

    async def rollout(self, ep, inp):
        try:
            state = await self.env.rollout(inp, ep.client, self.model, {})
            await ep.asked.put(("done", state))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - reported as the episode's error
            await ep.asked.put(("raised", e))

    def seed_random(self, ep):
        random.seed(f"{ep.seed}/{ep.sample}/{ep.turn}")

    async def advance(self, ep):
        """Runs the episode's loop until it asks for a turn or ends: the event."""
        ev = await ep.asked.get()
        if ev[0] == "raised":
            e = ev[1]
            raise EpisodeError(f"{self.name()}: the rollout raised {describe(e)} in {where(e)}")
        return ev

    async def score(self, ep, state):
        err = state.get("error")
        if err is not None:
            raise EpisodeError(f"{self.name()}: the rollout stopped on an error: {describe(err)} "
                               f"in {where(err)}")
        self.catcher.messages = []
        try:
            await self.env.rubric.score_rollout(state)
            await self.env.rubric.cleanup(state)
        except Exception as e:
            raise EpisodeError(f"{self.name()}: scoring raised {describe(e)} in {where(e)}")
        if self.catcher.messages:
            raise EpisodeError(f"{self.name()}: {self.catcher.messages[0]} (verifiers would "
                               "score it 0; rlvr makes the episode unscorable)")
        reward = state.get("reward")
        if not isinstance(reward, (int, float)) or reward != reward or reward in (
                float("inf"), float("-inf")):
            raise EpisodeError(f"{self.name()}: the rubric gave reward {reward!r}, not a finite "
                               "number")
        metrics = {k: v for k, v in (state.get("metrics") or {}).items()}
        log(f"[verifiers] episode {ep.id} reward {float(reward)!r} metrics "
            f"{json.dumps(metrics, sort_keys=True, default=str)}")
        return float(reward), wire_metrics(ep.id, metrics, float(reward))

    async def reset_one(self, req):
        eid = req["id"]
        ep = Episode(self, eid, req.get("seed", 0), req.get("sample", 0))
        inp = self.input_of(req.get("row") or {})
        ep.client = self.client_class(ep)
        # The K episodes of a group get the same seed and must get the same prompt.
        random.seed(f"{ep.seed}/reset")
        ep.task = asyncio.ensure_future(self.rollout(ep, inp))
        self.episodes[eid] = ep
        ev = await self.advance(ep)
        if ev[0] == "done":
            state = ev[1]
            raise EpisodeError(f"{self.name()}: the rollout ended before the model's first turn "
                               f"(stop condition {state.get('stop_condition')!r}; error "
                               f"{describe(state['error']) if state.get('error') else None})")
        prompt = ev[1]
        ep.prompt = prompt
        msgs = [wire_message(m, f"prompt message {i}") for i, m in enumerate(prompt)]
        out = {"id": eid}
        if any(m["role"] == "assistant" for m in msgs):
            out["dialogue"] = msgs
        else:
            out["messages"] = msgs
        if ep.tools:
            out["tools"] = ep.tools
        return out

    def response(self, ep, req):
        text = req.get("text") or ""
        calls = req.get("tool_calls") or []
        tool_calls = None
        content = text
        if calls:
            tool_calls = []
            for i, c in enumerate(calls):
                args = c.get("arguments", {})
                tool_calls.append(vf.ToolCall(
                    id=c.get("id") or f"call_{i}", name=c.get("name", ""),
                    arguments=args if isinstance(args, str) else json.dumps(args)))
            if not req.get("tool_call_errors") and "<tool_call>" in text:
                content = text.split("<tool_call>", 1)[0].strip()
        message = vf.ResponseMessage(content=content, tool_calls=tool_calls,
                                     finish_reason="tool_calls" if tool_calls else "stop",
                                     is_truncated=False)
        return vf.Response(id=f"rlvr-{ep.id}-{ep.turn}", created=int(time.time()),
                           model=self.model, message=message)

    async def step_one(self, req):
        eid = req["id"]
        ep = self.episodes.get(eid)
        if ep is None:
            raise EpisodeError(f"step for episode {eid!r}, which this program never reset")
        ep.turn = int(req.get("turn", ep.turn + 1))
        self.seed_random(ep)
        await ep.answers.put(self.response(ep, req))
        ev = await self.advance(ep)
        if ev[0] == "ask":
            prompt = ev[1]
            before = len(ep.prompt) + 1
            if len(prompt) < before:
                raise EpisodeError(
                    f"{self.name()}: the next prompt ({len(prompt)} messages) does not extend the "
                    f"last one and its answer ({before}); rollouts with non-linear message "
                    "sequences (get_prompt_messages overridden) are not supported")
            new = prompt[before:]
            ep.prompt = prompt
            msgs = [wire_message(m, f"env_response message {i}") for i, m in enumerate(new)]
            for m in msgs:
                if m["role"] not in ("user", "tool"):
                    raise EpisodeError(f"{self.name()}: env_response gave a {m['role']!r} "
                                       "message; rlvr's replies are user or tool messages")
            return {"id": eid, "messages": msgs, "done": False}
        state = ev[1]
        self.episodes.pop(eid, None)
        reward, metrics = await self.score(ep, state)
        final = state.get("final_env_response") or []
        msgs = [wire_message(m, f"final_env_response message {i}") for i, m in enumerate(final)]
        return {"id": eid, "messages": msgs, "reward": reward, "done": True, "metrics": metrics}

    async def finish_one(self, req):
        eid = req["id"]
        ep = self.episodes.pop(eid, None)
        if ep is None:
            return {"id": eid}
        if req.get("reason") == "error":
            ep.task.cancel()
            try:
                await ep.task
            except BaseException:  # noqa: BLE001 - the episode is closed unscored
                pass
            return {"id": eid}
        await ep.answers.put(CLOSE)
        ev = await self.advance(ep)
        if ev[0] == "ask":
            raise EpisodeError(f"{self.name()}: the rollout asked for another turn after rlvr "
                               "ended it")
        reward, metrics = await self.score(ep, ev[1])
        return {"id": eid, "reward": reward, "metrics": metrics}

    async def drop(self, eid):
        """Forgets a failed episode and cancels its rollout (it gets no `finish`)."""
        ep = self.episodes.pop(eid, None)
        if ep is not None and ep.task is not None and not ep.task.done():
            ep.task.cancel()
            try:
                await ep.task
            except BaseException:  # noqa: BLE001 - the episode already failed
                pass

    async def each(self, fn, reqs):
        """Runs `fn` over a request's episodes in order (deterministic), each error its own."""
        out = []
        for r in reqs:
            try:
                out.append(await fn(r))
            except EpisodeError as e:
                await self.drop(r.get("id"))
                out.append({"id": r.get("id"), "error": str(e)})
            except Exception as e:  # noqa: BLE001 - the adapter's own failure, named
                await self.drop(r.get("id"))
                out.append({"id": r.get("id"),
                            "error": f"{self.name()}: {describe(e)} in {where(e)}"})
        return out


# ----- verifiers 0.4.0: the verifiers.v1 stack -----
#
# A v1 episode is `env.run_episode(task, ctx)`: the env's agent runs a harness (a program, or a
# loop in-process) in a runtime; every model call the harness makes goes to verifiers' interception
# server, which records it on the episode's trace and forwards it to the model endpoint of
# `ctx.client` (an OpenAI-compatible base_url). Here that endpoint is this adapter's own HTTP
# server (Python's http.server, on 127.0.0.1): each chat-completion request pauses the episode
# and becomes rlvr's turn. The task's `@vf.reward`/`@vf.metric` functions score the trace.

# The request keys the adapter reads; every other key (temperature, max_tokens, stop, top_p,
# tool_choice, ...) is a sampling choice rlvr's own sampling makes, ignored and named once on
# stderr.
V1_READ_KEYS = ("model", "messages", "tools", "stream", "n")
V1_ROLES = ("system", "user", "assistant", "tool")


def v1_wire_message(m, what):
    """An OpenAI chat message (a dict) as the protocol's `{role, content, [tool_call_id],
    [tool_calls]}`; a `developer` message is a system one."""
    if not isinstance(m, dict):
        raise EpisodeError(f"{what} is a {type(m).__name__}, not a message object")
    role = m.get("role")
    if role == "developer":
        role = "system"
    if role not in V1_ROLES:
        raise EpisodeError(f"{what} has role {role!r}; rlvr's messages are {', '.join(V1_ROLES)}")
    out = {"role": role, "content": text_of(m.get("content"), what)}
    if role == "tool":
        out["tool_call_id"] = m.get("tool_call_id")
    calls = m.get("tool_calls") if role == "assistant" else None
    if calls:
        out["tool_calls"] = []
        for c in calls:
            fn = (c or {}).get("function") or {}
            out["tool_calls"].append({"id": c.get("id"), "type": "function",
                                      "function": {"name": fn.get("name"),
                                                   "arguments": fn.get("arguments")}})
    return out


def v1_message_key(m):
    """What must match for a message of one request to be the same message in the next: role,
    content, tool_call_id and the calls (arguments compared as JSON values)."""
    calls = []
    for c in m.get("tool_calls") or []:
        args = c["function"]["arguments"]
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        calls.append((c.get("id"), c["function"]["name"], json.dumps(args, sort_keys=True)))
    return (m["role"], m["content"], m.get("tool_call_id"), tuple(calls))


def v1_error_text(err, package):
    """`Type: message in function (file:line)` of a v1 `Error` record, the place its traceback's
    last frame in the environment's own code (not verifiers', not the standard library's), or
    without the place when there is none."""
    text = f"{getattr(err, 'type', '?')}: {getattr(err, 'message', err)}"
    tb = getattr(err, "traceback", None) or ""
    stdlib = sysconfig.get_paths()["stdlib"]
    frames = [f for f in re.findall(r'File "([^"]+)", line (\d+), in (\S+)', tb)
              if not f[0].startswith((package, stdlib))]
    if frames:
        path, line, fn = frames[-1]
        text += f" in {fn} ({os.path.basename(path)}:{line})"
    return text


class V1Episode:
    """One v1 episode: its run in the adapter's event loop and the model call it waits on."""

    def __init__(self, eid, seed, sample, token):
        self.id = eid
        self.seed = seed
        self.sample = sample
        self.token = token
        self.turn = 0
        # ("ask", body) | ("done", episode) | ("raised", exc) | ("error", msg)
        self.events = queue.Queue()
        self.lock = threading.Lock()
        self.pending = None  # the concurrent.futures.Future the waiting HTTP request blocks on
        self.transcript = None  # the messages so far, in wire form (the last request's + answer)
        self.tools = None
        self.stream = False  # whether the waiting call asked for server-sent events
        self.traces = []  # the episode's traces, as v1 mints them (on_trace)
        self.run = None


def v1_handler(adapter):
    """The HTTP handler of the adapter's model endpoint: `POST /rlvr/TOKEN/v1/chat/completions`
    (TOKEN names the episode) is a turn of that episode; `GET .../v1/models` names the model."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            return None

        def reply(self, status, payload, stream=False):
            if stream:
                data = payload
                ctype = "text/event-stream"
            else:
                data = json.dumps(payload).encode()
                ctype = "application/json"
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the harness went away (its episode was ended): nobody reads the reply

        def error(self, status, message):
            self.reply(status, {"error": {"message": message, "type": "invalid_request_error",
                                          "code": None}})

        def episode(self):
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            if len(parts) < 3 or parts[0] != "rlvr":
                return None, "/".join(parts)
            return adapter.by_token.get(parts[1]), "/".join(parts[2:])

        def do_GET(self):
            _, route = self.episode()
            if route in ("v1/models", "models"):
                self.reply(200, {"object": "list", "data": [
                    {"id": adapter.model, "object": "model", "owned_by": "rlvr"}]})
            else:
                self.error(404, f"rlvr's verifiers adapter serves no GET {self.path}")

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            ep, route = self.episode()
            if ep is None:
                self.error(410, "rlvr ended this episode")
                return
            if route not in ("v1/chat/completions", "chat/completions"):
                msg = (f"the harness called {route!r}; rlvr's verifiers adapter serves the "
                       "OpenAI chat completions API (v1/chat/completions) only")
                ep.events.put(("error", msg))
                self.error(404, msg)
                return
            try:
                body = json.loads(raw)
            except json.JSONDecodeError as e:
                self.error(400, f"request body is not JSON: {e}")
                return
            fut = concurrent.futures.Future()
            with ep.lock:
                if ep.pending is not None:
                    msg = ("the harness made a model call while another was waiting (parallel "
                           "calls, e.g. sub-agents); rlvr's episodes are one linear transcript")
                    ep.events.put(("error", msg))
                    self.error(400, msg)
                    return
                ep.pending = fut
            ep.events.put(("ask", body))
            status, payload, stream = fut.result()
            self.reply(status, payload, stream)

    return Handler


class V1Endpoint(ThreadingHTTPServer):
    """The adapter's model endpoint: a thread per connection; a connection the harness closed
    (its episode ended) is not an error worth a traceback."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class V1Adapter:
    """A verifiers.v1 environment (0.4.0) as an rlvr environment program."""

    def __init__(self, options, v1, version):
        self.v1 = v1
        self.version = version
        self.env_id = options["env_id"]
        self.model = options.get("model", "rlvr")
        if options.get("split", "train") != "train":
            raise ValueError(f"{self.name()}: option split is for verifiers {SUPPORTED}'s "
                             "datasets; a v1 taskset picks its tasks with its own config "
                             "(env_args) and rlvr's rows (example_id)")
        if version != SUPPORTED_V1:
            log(f"[verifiers] warning: verifiers {version} installed; the v1 adapter is tested "
                f"with {SUPPORTED_V1}")
        config = self.env_config(options)
        try:
            self.env = v1.load_environment(config)
        except Exception as e:
            raise ValueError(f"{self.name()}: loading the environment failed: {describe(e)} in "
                             f"{where(e)}") from e
        self.task_cls = type(self.env.taskset).task_type()
        self.tasks = {}
        self.task_iter = None
        self.episodes = {}
        self.by_token = {}
        self.tokens = 0
        self.ignored = set()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="verifiers-v1", daemon=True).start()
        self.server = V1Endpoint(("127.0.0.1", 0), v1_handler(self))
        threading.Thread(target=self.server.serve_forever, name="model-endpoint",
                         daemon=True).start()
        self.serving = self.env.serving()
        try:
            self.call(self.serving.__aenter__())
        except Exception as e:
            raise ValueError(f"{self.name()}: starting its serving resources (interception "
                             f"server, shared tools) failed: {describe(e)} in {where(e)}") from e

    def name(self):
        return f"verifiers environment {self.env_id!r}"

    def call(self, coro, timeout=None):
        """Runs `coro` in the adapter's event loop and waits for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def env_config(self, options):
        """The v1 env config: option `env_config` (the run config's `[env]` table: agent,
        harness, runtime, ...) with `taskset.id` = env_id and `env_args` merged into `taskset`;
        a role that names no runtime runs in the local `subprocess` runtime (verifiers'
        default is a remote Prime sandbox)."""
        raw = json.loads(json.dumps(options.get("env_config") or {}))
        if not isinstance(raw, dict):
            raise ValueError(f"option env_config must be a table, not {type(raw).__name__}")
        taskset = raw.setdefault("taskset", {})
        taskset["id"] = self.env_id
        taskset.update(options.get("env_args") or {})
        try:
            config = self.v1.resolve_env_config(raw)
            roles = [k for k, v in config if isinstance(v, self.v1.AgentConfig)]
            for role in roles:
                spec = raw.setdefault(role, {})
                if isinstance(spec, dict) and "runtime" not in spec:
                    spec["runtime"] = {"type": "subprocess"}
            return self.v1.resolve_env_config(raw)
        except Exception as e:
            raise ValueError(f"{self.name()}: its config is not valid: {describe(e)}") from e

    # ----- inputs -----

    def task_at(self, idx):
        """The taskset's task at position `idx` of its `load()` (read lazily, kept)."""
        if self.task_iter is None:
            self.task_iter = iter(self.env.taskset)
        while idx not in self.tasks and self.task_iter is not None:
            try:
                task = next(self.task_iter)
            except StopIteration:
                self.task_iter = None
                break
            self.tasks[task.data.idx] = task
        if idx not in self.tasks:
            raise EpisodeError(f"{self.name()} has no task at idx {idx} (its taskset has "
                               f"{len(self.tasks)})")
        return self.tasks[idx]

    def input_of(self, row):
        if row.get("example_id") not in (None, ""):
            try:
                idx = int(str(row["example_id"]))
            except ValueError:
                raise EpisodeError(f"row's example_id {row['example_id']!r} is not an integer")
            return self.task_at(idx)
        data_cls = self.task_cls.data_type()
        fields = data_cls.model_fields
        data = {}
        info = row.get("info")
        if isinstance(info, str) and info.strip():
            try:
                info = json.loads(info)
            except json.JSONDecodeError:
                raise EpisodeError("row's info is not JSON text")
        if isinstance(info, dict):
            data.update({k: v for k, v in info.items() if k in fields})
        data.update({k: v for k, v in row.items() if k in fields and k not in ("idx", "prompt")})
        prompt = row.get("prompt", row.get("question"))
        if isinstance(prompt, str) and prompt.lstrip().startswith("["):
            try:
                prompt = json.loads(prompt)
            except json.JSONDecodeError:
                pass
        if prompt is None:
            raise EpisodeError("row has neither example_id, nor prompt, nor question")
        data["prompt"] = prompt
        if "answer" in fields and "answer" not in data and "reference" in row:
            data["answer"] = row["reference"]
        if self.env.taskset.system_prompt is not None:
            data["system_prompt"] = self.env.taskset.system_prompt
        try:
            task_data = data_cls.model_validate(data)
        except Exception as e:
            raise EpisodeError(f"{self.name()}: the row is not a {data_cls.__name__}: "
                               f"{describe(e)}")
        return self.task_cls(task_data, self.env.taskset.config.task)

    def export_rows(self):
        """The taskset as rlvr rows: `example_id` (the task's idx), `question` (its prompt's
        last user text), `answer` (when its data has one), `info` (its other fields that are not
        their defaults, JSON)."""
        if not getattr(self.env.taskset, "bounded", True):
            raise ValueError(f"{self.name()}: its taskset is infinite; bound it in env_args")
        for task in self.env.taskset:
            d = task.data
            prompt = d.prompt
            if isinstance(prompt, list):
                users = [m for m in prompt if get(m, "role") == "user"]
                prompt = text_of(get(users[-1], "content"), "prompt") if users else ""
            row = {"example_id": d.idx, "question": prompt or ""}
            if getattr(d, "answer", None) is not None:
                row["answer"] = str(d.answer)
            rest = {k: v for k, v in d.model_dump(mode="json", exclude_defaults=True).items()
                    if k not in ("idx", "prompt", "system_prompt", "answer")}
            if rest:
                row["info"] = json.dumps(rest, sort_keys=True)
            yield row

    # ----- driving the episode -----

    async def run(self, ep, task, ctx):
        try:
            episode = await self.env.run_episode(task, ctx, on_trace=ep.traces.append)
            ep.events.put(("done", episode))
        except BaseException as e:  # noqa: BLE001 - reported as the episode's error
            ep.events.put(("raised", e))
            if isinstance(e, asyncio.CancelledError):
                raise

    def next_event(self, ep):
        ev = ep.events.get()
        if ev[0] == "raised":
            e = ev[1]
            raise EpisodeError(f"{self.name()}: the episode raised {describe(e)} in {where(e)}")
        if ev[0] == "error":
            raise EpisodeError(f"{self.name()}: {ev[1]}")
        return ev

    def answer(self, ep, status, payload, stream=False):
        with ep.lock:
            fut, ep.pending = ep.pending, None
        if fut is not None:
            fut.set_result((status, payload, stream))

    def read_request(self, ep, body):
        """The request's messages (wire form) and tools; refuses what rlvr cannot sample."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise EpisodeError(f"{self.name()}: a model call without a messages list")
        n = body.get("n")
        if n not in (None, 1):
            raise EpisodeError(f"{self.name()}: the harness asked for n = {n} completions of "
                               "one prompt; rlvr samples one per turn")
        for k in sorted(body):
            if k not in V1_READ_KEYS and k not in self.ignored:
                self.ignored.add(k)
                log(f"[verifiers] {self.name()}: request key {k!r} ({json.dumps(body[k])[:80]}) "
                    "ignored: rlvr's own sampling settings make every turn")
        msgs = [v1_wire_message(m, f"request message {i}") for i, m in enumerate(body["messages"])]
        return msgs, body.get("tools") or []

    def completion(self, ep, req, stream):
        """The model's turn as an OpenAI chat completion (or its server-sent events), and the
        assistant message in wire form."""
        text = req.get("text") or ""
        calls = req.get("tool_calls") or []
        content = text
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = []
            for i, c in enumerate(calls):
                args = c.get("arguments", {})
                message["tool_calls"].append({
                    "id": c.get("id") or f"call_{i}", "type": "function",
                    "function": {"name": c.get("name", ""),
                                 "arguments": args if isinstance(args, str) else json.dumps(args)}})
            if not req.get("tool_call_errors") and "<tool_call>" in text:
                message["content"] = text.split("<tool_call>", 1)[0].strip()
        finish = "tool_calls" if calls else "stop"
        head = {"id": f"rlvr-{ep.id}-{ep.turn}", "created": 0, "model": self.model}
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        if stream:
            delta = dict(message)
            if calls:
                delta["tool_calls"] = [dict(c, index=i)
                                       for i, c in enumerate(message["tool_calls"])]
            chunk = dict(head, object="chat.completion.chunk",
                         choices=[{"index": 0, "delta": delta, "finish_reason": finish}])
            tail = dict(head, object="chat.completion.chunk", choices=[], usage=usage)
            payload = (f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(tail)}\n\n"
                       "data: [DONE]\n\n").encode()
        else:
            payload = dict(head, object="chat.completion", usage=usage, choices=[
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}])
        return payload, v1_wire_message(message, "the model's turn")

    def reset_one(self, req):
        eid = req["id"]
        self.tokens += 1
        ep = V1Episode(eid, req.get("seed", 0), req.get("sample", 0), f"e{self.tokens}")
        task = self.input_of(req.get("row") or {})
        self.episodes[eid] = ep
        self.by_token[ep.token] = ep
        base_url = f"http://127.0.0.1:{self.server.server_address[1]}/rlvr/{ep.token}/v1"
        ctx = self.v1.ModelContext(model=self.model, client=self.v1.EvalClientConfig(
            base_url=base_url, api_key_var="RLVR_VERIFIERS_API_KEY"))
        # The K episodes of a group get the same seed and must get the same prompt.
        random.seed(f"{ep.seed}/reset")
        ep.run = asyncio.run_coroutine_threadsafe(self.run(ep, task, ctx), self.loop)
        ev = self.next_event(ep)
        if ev[0] == "done":
            raise EpisodeError(f"{self.name()}: the episode ended before the model's first turn"
                               f"{self.failure(ev[1])}")
        msgs, tools = self.read_request(ep, ev[1])
        ep.transcript, ep.tools, ep.stream = msgs, tools, bool(ev[1].get("stream"))
        out = {"id": eid}
        if any(m["role"] in ("assistant", "tool") for m in msgs):
            out["dialogue"] = msgs
        else:
            out["messages"] = msgs
        if tools:
            out["tools"] = tools
        return out

    def step_one(self, req):
        eid = req["id"]
        ep = self.episodes.get(eid)
        if ep is None:
            raise EpisodeError(f"step for episode {eid!r}, which this program never reset")
        ep.turn = int(req.get("turn", ep.turn + 1))
        if ep.pending is None:
            raise EpisodeError(f"{self.name()}: step for episode {eid!r}, which has no model "
                               "call waiting")
        stream = ep.stream
        payload, message = self.completion(ep, req, stream)
        ep.transcript = ep.transcript + [message]
        random.seed(f"{ep.seed}/{ep.sample}/{ep.turn}")
        self.answer(ep, 200, payload, stream)
        ev = self.next_event(ep)
        if ev[0] == "ask":
            msgs, tools = self.read_request(ep, ev[1])
            ep.stream = bool(ev[1].get("stream"))
            before = ep.transcript
            if len(msgs) < len(before) or any(
                    v1_message_key(a) != v1_message_key(b) for a, b in zip(msgs, before)):
                raise EpisodeError(
                    f"{self.name()}: the model call of turn {ep.turn + 1} does not extend the "
                    f"transcript so far ({len(before)} messages, the last the model's turn) "
                    f"with new messages (its {len(msgs)} messages rewrite or drop some: history "
                    "rewriting, compaction or a sub-agent's call); rlvr's episodes are one "
                    "linear transcript")
            if tools != ep.tools:
                raise EpisodeError(f"{self.name()}: the tools changed at turn {ep.turn + 1}; "
                                   "rlvr renders an episode's tools once, in its prompt")
            new = msgs[len(before):]
            for m in new:
                if m["role"] not in ("user", "tool"):
                    raise EpisodeError(f"{self.name()}: the harness added a {m['role']!r} "
                                       "message; rlvr's replies are user or tool messages")
            ep.transcript = msgs
            return {"id": eid, "messages": new, "done": False}
        self.forget(ep)
        reward, metrics = self.score(ep, ev[1])
        return {"id": eid, "messages": [], "reward": reward, "done": True, "metrics": metrics}

    def finish_one(self, req):
        eid = req["id"]
        ep = self.episodes.get(eid)
        if ep is None:
            return {"id": eid}
        if req.get("reason") == "error":
            self.drop(eid)
            return {"id": eid}
        # v1's own stop: the trace stops (as a @vf.stop condition stops it), the waiting call
        # is refused by the interception server, the harness ends, and the task scores it.
        condition = f"rlvr_{req.get('reason', 'finish')}"

        async def stop():
            for t in ep.traces:
                if t.stop_condition is None:
                    t.stop(condition)

        self.call(stop())
        payload, _ = self.completion(ep, {"text": ""}, ep.stream)
        self.answer(ep, 200, payload, ep.stream)
        ev = self.next_event(ep)
        if ev[0] == "ask":
            raise EpisodeError(f"{self.name()}: the harness made another model call after rlvr "
                               "ended the episode")
        self.forget(ep)
        reward, metrics = self.score(ep, ev[1])
        return {"id": eid, "reward": reward, "metrics": metrics}

    def failure(self, episode):
        """`: ERROR` of a failed v1 episode (its first error, the episode's or a trace's)."""
        errors = list(episode.errors) + [e for t in episode.traces for e in t.errors]
        package = os.path.dirname(os.path.dirname(os.path.abspath(self.v1.__file__)))
        return f": {v1_error_text(errors[0], package + os.sep)}" if errors else ""

    def score(self, ep, episode):
        if not episode.ok:
            raise EpisodeError(f"{self.name()}: the episode failed{self.failure(episode)}")
        if len(episode.traces) != 1:
            raise EpisodeError(f"{self.name()}: the episode ran {len(episode.traces)} agents; "
                               "rlvr trains one transcript per episode")
        trace = episode.traces[0]
        unscored = sorted(k for k, r in trace.rewards.items() if r is None)
        if unscored:
            raise EpisodeError(f"{self.name()}: rewards {unscored} were not scored")
        reward = trace.reward
        if not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise EpisodeError(f"{self.name()}: the task gave reward {reward!r}, not a finite "
                               "number")
        metrics = {k: r.score for k, r in trace.rewards.items()}
        metrics.update({k: v for k, v in trace.metrics.items() if v is not None})
        log(f"[verifiers] episode {ep.id} reward {float(reward)!r} metrics "
            f"{json.dumps(metrics, sort_keys=True, default=str)} stop {trace.stop_condition}")
        return float(reward), wire_metrics(ep.id, metrics, float(reward))

    def forget(self, ep):
        self.episodes.pop(ep.id, None)
        self.by_token.pop(ep.token, None)

    def drop(self, eid):
        """Forgets an episode and cancels its run: its waiting call is refused, its cleanups
        run (waited for up to a minute)."""
        ep = self.episodes.get(eid)
        if ep is None:
            return
        self.forget(ep)
        self.answer(ep, 410, {"error": {"message": "rlvr ended this episode"}})
        if ep.run is not None and not ep.run.done():
            self.loop.call_soon_threadsafe(ep.run.cancel)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    ev = ep.events.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if ev[0] in ("done", "raised"):
                    break
                self.answer(ep, 410, {"error": {"message": "rlvr ended this episode"}})

    def handle(self, kind, episodes):
        """One protocol request's episodes answered in order, or None for an unknown `kind`."""
        fn = {"reset": self.reset_one, "step": self.step_one,
              "finish": self.finish_one}.get(kind)
        if fn is None:
            return None
        out = []
        for r in episodes:
            try:
                out.append(fn(r))
            except EpisodeError as e:
                self.drop(r.get("id"))
                out.append({"id": r.get("id"), "error": str(e)})
            except Exception as e:  # noqa: BLE001 - the adapter's own failure, named
                self.drop(r.get("id"))
                out.append({"id": r.get("id"),
                            "error": f"{self.name()}: {describe(e)} in {where(e)}"})
        return out

    def close(self):
        """Cancels the episodes still running and ends the env's serving resources."""
        for eid in list(self.episodes):
            self.drop(eid)
        try:
            self.call(self.serving.__aexit__(None, None, None), timeout=60)
        except Exception as e:  # noqa: BLE001 - shutting down; said on stderr
            log(f"[verifiers] {self.name()}: closing its serving resources: {describe(e)}")
        self.server.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)


def export(argv):
    import argparse
    p = argparse.ArgumentParser(prog="verifiers_env.py export",
                                description="write a verifiers environment's dataset as rlvr "
                                            "JSONL rows (example_id, question, answer, info)")
    p.add_argument("--env-id", required=True)
    p.add_argument("--env-args", default="{}", help="load_environment's arguments, a JSON object")
    p.add_argument("--split", default="train", choices=["train", "eval"])
    p.add_argument("--path", action="append", default=[], help="a directory for sys.path")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    ad = make_adapter({"env_id": a.env_id, "env_args": json.loads(a.env_args),
                       "split": a.split, "paths": a.path})
    n = 0
    with open(a.out, "w") as f:
        for row in ad.export_rows():
            f.write(json.dumps(row) + "\n")
            n += 1
    ad.close()
    log(f"wrote {n} rows of {a.env_id}'s {a.split} dataset to {a.out}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "export":
        sys.stdout = OUT
        export(sys.argv[2:])
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    adapter = None
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        kind = req.get("type")
        if kind == "hello":
            try:
                adapter = make_adapter(req.get("options") or {})
            except Exception as e:  # noqa: BLE001 - reported to rlvr, which stops the run
                send({"error": str(e)})
                return
            log(f"[verifiers] {adapter.name()} loaded (verifiers {adapter.version}, "
                f"{type(adapter.env).__name__})")
            send({"version": PROTOCOL})
            continue
        if adapter is None:
            send({"error": f"{kind} before hello"})
            return
        episodes = adapter.handle(kind, req.get("episodes") or [])
        if episodes is None:
            send({"error": f"unknown request type {kind!r}"})
            return
        send({"version": PROTOCOL, "episodes": episodes})
    # rlvr closed stdin: the rollouts still running are cancelled, so their cleanups run.
    if adapter is not None:
        adapter.close()


if __name__ == "__main__":
    main()

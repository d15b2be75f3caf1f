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

Supported: verifiers 0.3.1 (pinned; `pip install verifiers==0.3.1`), whose classic stack answers
at `import verifiers as vf`. verifiers 0.4.0 ships only the new `verifiers.v1` stack (harnesses,
tasksets, runtimes) and has no `load_environment`: it is refused at `hello`, naming the version.
Guide: docs/coming-from-prime-rl.md.

How an episode runs. The environment's own rollout loop runs (`env.rollout(input, client, model,
sampling_args)`, its `setup_state`, stop conditions, `env_response`, tools and cleanups), with a
client that does not call a model: each time the loop asks the client for a response, the episode
pauses and rlvr samples the turn. So

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
`model` (the name the environment sees, default `rlvr`). Each rollout step runs with Python's
`random` seeded from the episode's seed, sample and turn, so an environment that draws from it
replays identically after a restart.
"""
import asyncio
import json
import logging
import math
import os
import random
import sys
import time
import traceback
import unicodedata

PROTOCOL = 1
SUPPORTED = "0.3.1"

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


class Adapter:
    def __init__(self, options):
        global vf
        env_id = options.get("env_id")
        if not isinstance(env_id, str) or not env_id:
            raise ValueError("option env_id (the verifiers environment id, env.verifiers) is "
                             "required")
        self.env_id = env_id
        args = options.get("env_args") or {}
        if not isinstance(args, dict):
            raise ValueError(f"option env_args must be a table, not {type(args).__name__}")
        for p in reversed(options.get("paths") or []):
            sys.path.insert(0, os.path.abspath(p))
        self.split = options.get("split", "train")
        if self.split not in ("train", "eval"):
            raise ValueError(f"option split is {self.split!r}; it is train or eval")
        self.model = options.get("model", "rlvr")
        try:
            import verifiers
        except ImportError as e:
            raise ValueError(f"cannot import verifiers ({e}): pip install verifiers=={SUPPORTED} "
                             "into the Python that runs this environment (env.python)") from e
        version = getattr(verifiers, "__version__", "?")
        if not hasattr(verifiers, "load_environment"):
            raise ValueError(
                f"verifiers {version} has no classic API (load_environment, vf.Environment): "
                f"rlvr's adapter supports verifiers {SUPPORTED} (pip install "
                f"verifiers=={SUPPORTED}); the verifiers.v1 stack is not supported")
        vf = verifiers
        self.version = version
        if version != SUPPORTED:
            log(f"[verifiers] warning: verifiers {version} installed; the adapter is tested "
                f"with {SUPPORTED}")
        try:
            self.env = vf.load_environment(env_id, **args)
        except Exception as e:
            raise ValueError(f"verifiers environment {env_id!r}: load_environment failed: "
                             f"{describe(e)} in {where(e)}") from e
        if getattr(self.env.rubric, "has_group_rewards", False):
            raise ValueError(
                f"verifiers environment {env_id!r}: its rubric has group reward functions, which "
                "score a group's rollouts together; rlvr needs each episode's reward when it "
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
    ad = Adapter({"env_id": a.env_id, "env_args": json.loads(a.env_args), "split": a.split,
                  "paths": a.path})
    n = 0
    with open(a.out, "w") as f:
        for key, ex in sorted(ad.dataset().items()):
            prompt = ex.get("prompt") or []
            users = [m for m in prompt if get(m, "role") == "user"]
            question = text_of(get(users[-1], "content"), "prompt") if users else ""
            info = ex.get("info")
            row = {"example_id": key, "question": question, "answer": str(ex.get("answer", ""))}
            if info not in (None, "", {}):
                row["info"] = info if isinstance(info, str) else json.dumps(info, default=str)
            f.write(json.dumps(row) + "\n")
            n += 1
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
                adapter = Adapter(req.get("options") or {})
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
        fn = {"reset": adapter.reset_one, "step": adapter.step_one,
              "finish": adapter.finish_one}.get(kind)
        if fn is None:
            send({"error": f"unknown request type {kind!r}"})
            return
        episodes = loop.run_until_complete(adapter.each(fn, req.get("episodes") or []))
        send({"version": PROTOCOL, "episodes": episodes})
    # rlvr closed stdin: the rollouts still paused are cancelled, so their cleanups run.
    if adapter is not None:
        for eid in list(adapter.episodes):
            loop.run_until_complete(adapter.drop(eid))


if __name__ == "__main__":
    main()

"""STAND-IN for Prime Intellect's `verifiers` 0.3.1 (its classic API, `import verifiers as vf`),
for rlvr's tests only, so that CI needs no `pip install verifiers` (whose dependencies include
transformers, openai, mcp, ...). It has the API shape examples/verifiers_env.py and the test
environments (../../envs) use, with the real package's semantics for them, written from reading
verifiers 0.3.1's `verifiers/legacy` sources:

- `load_environment(env_id, **args)` imports the module `env_id` with `-` as `_` and calls its
  `load_environment(**args)`; an import failure is a ValueError, another failure a RuntimeError;
- `Environment` formats its dataset (`example_id`, and `prompt` from `question` with the system
  prompt and few-shot messages); `MultiTurnEnv.rollout(input, client, model, sampling_args)` is
  the real loop: `setup_state`, then until a stop condition (`@vf.stop`, highest priority first:
  `has_error`, then by name) holds: the prompt (the first: the input's; later: the last prompt,
  its completion and `env_response`), the client's `get_response`, the trajectory step; a
  `vf.Error` from either is `state["error"]` (`OverlongPromptError`: `prompt_too_long`); then
  the completion is rendered and cleanups run;
- `ToolEnv` turns functions into tools, answers each tool call with a `tool` message (a bad
  call's error text as the content) and stops at the first turn without tool calls;
- `Rubric.score_rollout(state)` calls each function with the arguments it names (`prompt`,
  `completion`, `answer`, `state`, `info`, `task`), logs "Error calling reward function NAME:
  ..." and scores 0 when one raises, and sets `state["reward"]` (the weighted sum) and
  `state["metrics"]` (each function's score by name); `MultiTurnEnv` adds `num_turns`, `ToolEnv`
  `total_tool_calls` and `NAME_calls` (weight 0) in a `RubricGroup`, as the real ones do.

It is not the real package: scripts/check_verifiers_env.py runs the same environments through the
adapter with verifiers 0.3.1 itself and checks the same values.
"""
import importlib
import inspect
import json
import logging
from abc import ABC, abstractmethod

__version__ = "0.3.1+rlvr-standin"

logger = logging.getLogger("verifiers.rubrics.rubric")


# ----- errors -----

class Error(Exception):
    pass


class OverlongPromptError(Error):
    pass


class ToolParseError(Error):
    pass


class ToolCallError(Error):
    pass


# ----- messages -----

class _Model:
    """Attribute and dict-like access, as verifiers' pydantic models allow."""

    def __init__(self, **kw):
        for k, v in {**self._defaults(), **kw}.items():
            setattr(self, k, v)

    def _defaults(self):
        return {}

    def __getitem__(self, k):
        return getattr(self, k)

    def __setitem__(self, k, v):
        setattr(self, k, v)

    def get(self, k, default=None):
        return getattr(self, k, default)

    def __contains__(self, k):
        return hasattr(self, k)


class SystemMessage(_Model):
    def _defaults(self):
        return {"role": "system"}


class UserMessage(_Model):
    def _defaults(self):
        return {"role": "user"}


class AssistantMessage(_Model):
    def _defaults(self):
        return {"role": "assistant", "content": None, "tool_calls": None}


class ToolMessage(_Model):
    def _defaults(self):
        return {"role": "tool"}


class ToolCall(_Model):
    pass


class Tool(_Model):
    pass


class ResponseMessage(AssistantMessage):
    pass


class Response(_Model):
    pass


class State(dict):
    pass


_ROLES = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage,
          "tool": ToolMessage}


def normalize_messages(messages):
    if isinstance(messages, str):
        return [UserMessage(content=messages)]
    out = []
    for m in messages:
        if isinstance(m, dict):
            m = _ROLES[m["role"]](**{k: v for k, v in m.items() if k != "role"})
        out.append(m)
    return out


# ----- decorators -----

def stop(func=None, priority=0):
    def mark(f):
        f._vf_stop = priority
        return f
    return mark(func) if func is not None else mark


def _stop_conditions(obj):
    found = []
    for name in dir(type(obj)):
        f = getattr(type(obj), name, None)
        if callable(f) and hasattr(f, "_vf_stop"):
            found.append((-f._vf_stop, name, getattr(obj, name)))
    return [f for _, _, f in sorted(found, key=lambda t: (t[0], t[1]))]


async def _maybe_await(x):
    return await x if inspect.isawaitable(x) else x


async def _call_named(f, **available):
    params = inspect.signature(f).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return await _maybe_await(f(**available))
    return await _maybe_await(f(**{k: v for k, v in available.items() if k in params}))


# ----- rubrics -----

class Rubric:
    def __init__(self, funcs=None, weights=None, **kwargs):
        self.funcs = list(funcs or [])
        self.weights = list(weights) if weights is not None else [1.0] * len(self.funcs)

    def add_reward_func(self, func, weight=1.0):
        self.funcs.append(func)
        self.weights.append(weight)

    def add_metric(self, func, weight=0.0):
        self.add_reward_func(func, weight)

    @property
    def has_group_rewards(self):
        return False

    async def score_rollout(self, state):
        objects = {"prompt": state["prompt"], "completion": state["completion"],
                   "answer": state.get("answer", ""), "state": state,
                   "info": state.get("info", {}), "task": state.get("task")}
        scores = []
        for f in self.funcs:
            try:
                scores.append(float(await _call_named(f, **objects)))
            except Exception as e:  # noqa: BLE001 - as verifiers: logged, scored 0
                logger.error(f"Error calling reward function {f.__name__}: {e}")
                scores.append(0.0)
        state["reward"] = sum(s * w for s, w in zip(scores, self.weights))
        state["metrics"] = {f.__name__: s for f, s in zip(self.funcs, scores)}

    async def cleanup(self, state):
        return None

    async def teardown(self):
        return None


class RubricGroup(Rubric):
    def __init__(self, rubrics):
        super().__init__()
        self.rubrics = rubrics

    @property
    def has_group_rewards(self):
        return any(r.has_group_rewards for r in self.rubrics)

    async def score_rollout(self, state):
        total, metrics = 0.0, {}
        for r in self.rubrics:
            await r.score_rollout(state)
            total += state["reward"]
            for k, v in state["metrics"].items():
                metrics[k] = metrics.get(k, 0.0) + v
        state["reward"], state["metrics"] = total, metrics

    async def cleanup(self, state):
        for r in self.rubrics:
            await r.cleanup(state)


# ----- clients -----

class Client(ABC):
    def __init__(self, client_or_config):
        self._client = client_or_config

    @abstractmethod
    def setup_client(self, config): ...

    @abstractmethod
    async def to_native_tool(self, tool): ...

    @abstractmethod
    async def to_native_prompt(self, messages): ...

    @abstractmethod
    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs): ...

    @abstractmethod
    async def raise_from_native_response(self, response): ...

    @abstractmethod
    async def from_native_response(self, response): ...

    @abstractmethod
    async def close(self): ...

    async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        native, extra = await self.to_native_prompt(prompt)
        r = await self.get_native_response(native, model, sampling_args, tools, **extra)
        await self.raise_from_native_response(r)
        return await self.from_native_response(r)


# ----- environments -----

class Environment(ABC):
    def __init__(self, dataset=None, eval_dataset=None, system_prompt=None, few_shot=None,
                 rubric=None, tool_defs=None, **kwargs):
        self.system_prompt = system_prompt
        self.few_shot = few_shot
        self.rubric = rubric or Rubric()
        self.tool_defs = tool_defs
        self.env_id = ""
        self.env_args = {}
        for k, v in kwargs.items():
            setattr(self, k, v)
        if dataset is None and eval_dataset is None:
            raise ValueError("Either dataset or eval_dataset must be provided")
        self.dataset = self._format(dataset) if dataset is not None else None
        self.eval_dataset = self._format(eval_dataset) if eval_dataset is not None else None

    def _format(self, ds):
        if "example_id" not in ds.column_names:
            ds = ds.add_column("example_id", range(len(ds)))
        if "prompt" not in ds.column_names:
            def fmt(row):
                msgs = []
                if self.system_prompt:
                    msgs.append({"role": "system", "content": self.system_prompt})
                msgs.extend(self.few_shot or [])
                msgs.append({"role": "user", "content": row["question"]})
                return {"prompt": msgs}
            ds = ds.map(fmt)
        return ds

    def get_dataset(self, n=-1, seed=None):
        if self.dataset is None:
            raise ValueError("dataset is not set")
        return self.dataset

    def get_eval_dataset(self, n=-1, seed=None):
        return self.eval_dataset if self.eval_dataset is not None else self.get_dataset()

    def add_rubric(self, rubric):
        if isinstance(self.rubric, RubricGroup):
            self.rubric.rubrics.append(rubric)
        else:
            self.rubric = RubricGroup([self.rubric, rubric])

    async def init_state(self, input, client, model, sampling_args=None):
        state = State(dict(input))
        info = state.get("info")
        if isinstance(info, str):
            state["info"] = json.loads(info)
        state["prompt"] = normalize_messages(input["prompt"])
        state["client"], state["model"], state["sampling_args"] = client, model, sampling_args
        state["tool_defs"] = list(self.tool_defs or [])
        state.update(trajectory=[], completion=None, reward=None, metrics=None, error=None,
                     final_env_response=None, is_completed=False, is_truncated=False)
        return state

    async def is_completed(self, state, **kwargs):
        for cond in _stop_conditions(self):
            if await _call_named(cond, state=state, env=self):
                state["is_completed"] = True
                state["stop_condition"] = cond.__name__
                return True
        return False

    async def get_model_response(self, state, prompt):
        return await state["client"].get_response(prompt=prompt, model=state["model"],
                                                  tools=state["tool_defs"] or None,
                                                  sampling_args=state["sampling_args"] or {},
                                                  state=state)

    @abstractmethod
    async def rollout(self, input, client, model, sampling_args=None): ...


class MultiTurnEnv(Environment):
    def __init__(self, max_turns=-1, **kwargs):
        super().__init__(**kwargs)
        self.max_turns = max_turns

        async def num_turns(state):
            return len(state["trajectory"])
        monitor = Rubric()
        monitor.add_metric(num_turns)
        self.add_rubric(monitor)

    @abstractmethod
    async def env_response(self, messages, state, **kwargs): ...

    @stop(priority=100)
    async def has_error(self, state):
        return state.get("error") is not None

    @stop
    async def prompt_too_long(self, state):
        return state.get("prompt_too_long", False)

    @stop
    async def max_turns_reached(self, state):
        return self.max_turns > 0 and len(state["trajectory"]) >= self.max_turns

    @stop
    async def has_final_env_response(self, state):
        return state.get("final_env_response") is not None

    async def setup_state(self, state):
        return state

    async def get_prompt_messages(self, state):
        if not state["trajectory"]:
            return state["prompt"]
        last = state["trajectory"][-1]
        messages = list(last["prompt"]) + list(last["completion"])
        return messages + normalize_messages(await self.env_response(messages, state))

    async def rollout(self, input, client, model, sampling_args=None):
        state = await self.init_state(input, client, model, sampling_args)
        try:
            state = await self.setup_state(state) or state
        except Error as e:
            state["error"] = e
        while not await self.is_completed(state):
            try:
                prompt = await self.get_prompt_messages(state)
                if state.get("final_env_response") is not None:
                    continue
                response = await self.get_model_response(state, prompt)
                m = response.message
                state["trajectory"].append({
                    "prompt": prompt,
                    "completion": [AssistantMessage(content=m.content, tool_calls=m.tool_calls)],
                    "response": response, "reward": None})
            except Error as e:
                if isinstance(e, OverlongPromptError):
                    state["prompt_too_long"] = True
                    state["is_truncated"] = True
                else:
                    state["error"] = e
        if state["trajectory"]:
            last = state["trajectory"][-1]
            full = list(last["prompt"]) + list(last["completion"])
            if state.get("final_env_response"):
                full += normalize_messages(state["final_env_response"])
            state["completion"] = full[len(state["prompt"]):]
        else:
            state["completion"] = []
        return state


class SingleTurnEnv(MultiTurnEnv):
    def __init__(self, **kwargs):
        super().__init__(max_turns=1, **kwargs)

    async def env_response(self, messages, state, **kwargs):
        raise NotImplementedError


_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array",
               dict: "object"}


def _tool_def(func):
    sig = inspect.signature(func)
    props = {n: {"type": _JSON_TYPES.get(p.annotation, "string")}
             for n, p in sig.parameters.items()}
    doc = (inspect.getdoc(func) or "").split("\n\n")[0]
    return Tool(name=func.__name__, description=doc,
                parameters={"type": "object", "properties": props, "required": list(props)})


class ToolEnv(MultiTurnEnv):
    def __init__(self, tools=None, max_turns=10, **kwargs):
        self.tools = list(tools or [])
        self.tool_map = {t.__name__: t for t in self.tools}
        super().__init__(tool_defs=[_tool_def(t) for t in self.tools], max_turns=max_turns,
                         **kwargs)

        async def total_tool_calls(completion):
            return float(sum(len(m.tool_calls or []) for m in completion
                             if m.role == "assistant"))
        monitor = Rubric()
        monitor.add_metric(total_tool_calls)
        for name in self.tool_map:
            def counter(completion, name=name):
                return sum(1 for m in completion if m.role == "assistant"
                           for c in (m.tool_calls or []) if c.name == name)
            counter.__name__ = f"{name}_calls"
            monitor.add_metric(counter)
        self.add_rubric(monitor)

    @stop
    async def no_tools_called(self, state):
        if not state["trajectory"]:
            return False
        last = state["trajectory"][-1]["completion"][-1]
        return last.role == "assistant" and not last.tool_calls

    async def env_response(self, messages, state, **kwargs):
        out = []
        for call in messages[-1].tool_calls:
            try:
                result = await _maybe_await(self.tool_map[call.name](**json.loads(call.arguments)))
                content = str(result)
            except Exception as e:  # noqa: BLE001 - as verifiers: the error is the tool's reply
                content = f"{e}"
            out.append(ToolMessage(content=content, tool_call_id=call.id))
        return out


def load_environment(env_id, **env_args):
    name = env_id.replace("-", "_").split("/")[-1]
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise ValueError(f"Could not import '{env_id}' environment. Ensure the package for the "
                         f"'{env_id}' environment is installed.") from e
    try:
        env = module.load_environment(**env_args)
    except Exception as e:
        raise RuntimeError(f"Failed to load environment '{env_id}': {e}") from e
    env.env_id = env.env_id or env_id
    env.env_args = env.env_args or env_args
    return env


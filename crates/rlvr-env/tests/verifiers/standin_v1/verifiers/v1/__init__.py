"""STAND-IN for Prime Intellect's `verifiers.v1` (verifiers 0.4.0), for rlvr's tests only, so that
CI needs no `pip install verifiers` (whose dependencies include pydantic, aiohttp, httpx, mcp,
openai, ...). It has the API shape examples/verifiers_env.py and the test taskset
(../../../envs/vf_guess_v1) use, with the real package's semantics for them, written from reading
verifiers 0.4.0's `verifiers/v1` sources, in the standard library only:

- config models (`TaskData`, `TasksetConfig`, `HarnessConfig`, ...) are classes whose annotated
  fields have defaults, validated like pydantic's lax mode for int/float/bool/str and refusing
  unknown keys ("Extra inputs are not permitted");
- `resolve_env_config({"taskset": {"id": ID, ...}, "agent": {...}})` imports the taskset package
  `ID` (`-` as `_`, lower case), which exports its `Taskset` subclass (and here must export its
  `Harness` subclass: the stand-in runs no program harnesses) via `__all__`;
- `Env.serving()` runs an interception server (http.server, 127.0.0.1): each harness call to
  `POST {endpoint}/chat/completions` with its bearer secret is forwarded to the episode's
  `ctx.client.base_url` + `/chat/completions`; when the trace has stopped meanwhile, the harness
  gets a 400 "rollout stopped" and the turn is not recorded; else the request's messages and the
  reply become the trace's messages;
- `Env.run_episode(task, ctx, on_trace=)`: the trace is minted (`on_trace`), the harness's
  `launch` runs; a non-zero exit is a `HarnessError` unless the trace stopped; the trace stops as
  `agent_completed`; then `task.score(trace)` runs the task's `@reward`/`@metric` methods (by
  name, with the arguments they name: `task`, `trace`), a raise a `TaskError`; a failure is the
  trace's error (`Error`: type, message, traceback) and the episode is not ok.

It is not the real package (no runtimes, judges, tool servers, retries, dialects other than chat
completions).
"""
import asyncio
import contextlib
import dataclasses
import importlib
import json
import threading
import traceback
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


# ----- config models -----

class _Model:
    """Fields: the class annotations (through the MRO) with their defaults."""

    _params = ()

    def __class_getitem__(cls, params):
        params = params if isinstance(params, tuple) else (params,)
        return type(cls.__name__, (cls,), {"_params": params, "__module__": cls.__module__})

    @classmethod
    def _fields(cls):
        out = {}
        for klass in reversed(cls.__mro__):
            for name, kind in getattr(klass, "__annotations__", {}).items():
                if not name.startswith("_"):
                    out[name] = (kind, getattr(klass, name, None))
        return out

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls.model_fields = cls._fields()

    def __init__(self, **kw):
        fields = self._fields()
        extra = sorted(set(kw) - set(fields))
        if extra:
            raise ValueError(f"1 validation error for {type(self).__name__}\n{extra[0]}\n  "
                             "Extra inputs are not permitted")
        for name, (kind, default) in fields.items():
            value = kw.get(name, default)
            if isinstance(value, (list, dict)) and name not in kw:
                value = json.loads(json.dumps(value))
            if name in kw and kind in (int, float, str) and value is not None:
                value = kind(value)
            if name in kw and kind is bool and isinstance(value, str):
                value = value.lower() in ("1", "true", "yes")
            object.__setattr__(self, name, value)

    @classmethod
    def model_validate(cls, data):
        return cls(**data)

    def model_copy(self, update=None):
        return type(self)(**dict(self._values(), **(update or {})))

    def _values(self):
        return {name: getattr(self, name) for name in self._fields()}

    def model_dump(self, mode="python", exclude_defaults=False, exclude_none=False):
        out = {}
        for name, (_, default) in self._fields().items():
            value = getattr(self, name)
            if (exclude_defaults and value == default) or (exclude_none and value is None):
                continue
            out[name] = value.model_dump(mode) if isinstance(value, _Model) else value
        return out

    def __iter__(self):
        return iter(self._values().items())


class TaskData(_Model):
    idx: int = None
    id: str = None
    name: str = None
    prompt: object = None
    system_prompt: str = None


class TaskConfig(_Model):
    pass


class TasksetConfig(_Model):
    id: str = ""
    task: object = None
    system_prompt: str = None


class HarnessConfig(_Model):
    id: str = "bash"


class AgentConfig(_Model):
    harness: object = None
    runtime: object = None


@dataclasses.dataclass(frozen=True)
class EvalClientConfig:
    base_url: str
    api_key_var: str = "PRIME_API_KEY"


@dataclasses.dataclass(frozen=True)
class ModelContext:
    model: str
    client: EvalClientConfig
    sampling: object = None


@dataclasses.dataclass
class ProgramResult:
    exit_code: int
    stdout: str
    stderr: str


class RolloutError(Exception):
    pass


class HarnessError(RolloutError):
    pass


class TaskError(RolloutError):
    pass


# ----- tasks, tasksets, harnesses -----

def reward(func=None, weight=1.0, priority=0):
    def mark(f):
        f._vf_kind, f._vf_weight = "reward", weight
        return f
    return mark if func is None else mark(func)


def metric(func=None, priority=0):
    def mark(f):
        f._vf_kind = "metric"
        return f
    return mark if func is None else mark(func)


def _param(cls, base):
    for klass in cls.__mro__:
        for p in getattr(klass, "_params", ()):
            if isinstance(p, type) and issubclass(p, base):
                return p
    return base


class Task(_Model):
    def __init__(self, data, config=None):
        self.data = data
        self.config = config if config is not None else TaskConfig()

    @classmethod
    def data_type(cls):
        return _param(cls, TaskData)

    def with_data(self, **update):
        return type(self)(self.data.model_copy(update), self.config)

    def _hooks(self, kind):
        names = sorted(n for n in dir(type(self))
                       if getattr(getattr(type(self), n), "_vf_kind", None) == kind)
        return [getattr(self, n) for n in names]

    async def score(self, trace):
        available = {"task": self.data, "trace": trace}
        try:
            for fn in self._hooks("metric"):
                args = {k: available[k] for k in fn.__code__.co_varnames[1:fn.__code__.co_argcount]}
                trace.metrics[fn.__name__] = float(await fn(**args))
            for fn in self._hooks("reward"):
                args = {k: available[k] for k in fn.__code__.co_varnames[1:fn.__code__.co_argcount]}
                trace.rewards[fn.__name__] = Reward(float(await fn(**args)), fn._vf_weight)
        except Exception as e:
            raise TaskError(f"task {type(self).__name__} scoring: {type(e).__name__}: {e}") from e


class Taskset(_Model):
    INFINITE = False

    def __init__(self, config):
        self.config = config
        self.system_prompt = None

    @classmethod
    def task_type(cls):
        return _param(cls, Task)

    @classmethod
    def config_type(cls):
        return _param(cls, TasksetConfig)

    @property
    def bounded(self):
        return not self.INFINITE

    def __iter__(self):
        for idx, task in enumerate(self.load()):
            yield task.with_data(idx=idx)


class Harness(_Model):
    APPENDS_SYSTEM_PROMPT = False

    def __init__(self, config):
        self.config = config

    @classmethod
    def config_type(cls):
        return _param(cls, HarnessConfig)

    def resolve_prompt(self, task):
        if task.system_prompt is None or self.APPENDS_SYSTEM_PROMPT:
            return task.system_prompt, task.prompt
        return None, f"{task.system_prompt}\n\n{task.prompt}"


# ----- traces and episodes -----

@dataclasses.dataclass
class Reward:
    score: float
    weight: float = 1.0

    @property
    def value(self):
        return self.score * self.weight


@dataclasses.dataclass
class Error:
    type: str
    message: str
    traceback: str = None


class Message:
    def __init__(self, m):
        self.role = m.get("role")
        self.content = m.get("content")
        self.tool_calls = m.get("tool_calls")


class Trace:
    def __init__(self, task):
        self.id = uuid.uuid4().hex
        self.task = task
        self.rewards = {}
        self.metrics = {}
        self.messages = []
        self.errors = []
        self.stop_condition = None
        self.ok = False

    @property
    def reward(self):
        return sum(r.value for r in self.rewards.values() if r is not None)

    @property
    def assistant_messages(self):
        return [m for m in self.messages if m.role == "assistant"]

    def stop(self, condition, override=False):
        if override or self.stop_condition is None:
            self.stop_condition = condition

    def record_error(self, error):
        self.errors.append(Error(type(error).__name__, str(error),
                                 "".join(traceback.format_exception(error))))
        self.ok = False
        self.stop(f"{type(error).__name__.lower()}")


@dataclasses.dataclass
class Episode:
    traces: list
    ok: bool = False
    errors: list = dataclasses.field(default_factory=list)


# ----- loading -----

def _plugin(plugin_id, base, kind):
    module_name = plugin_id.rsplit("/", 1)[-1].replace("-", "_").lower()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"{kind} {plugin_id!r} not found (tried to import "
                                  f"{module_name!r})") from e
    found = [getattr(module, n) for n in getattr(module, "__all__", [])
             if isinstance(getattr(module, n, None), type) and issubclass(getattr(module, n), base)]
    if len(found) != 1:
        raise TypeError(f"{kind} module {module_name!r} exports {len(found)} {base.__name__} "
                        "subclasses via `__all__`; export exactly one")
    return found[0]


class EnvConfig(_Model):
    taskset: object = None
    agent: object = None


def resolve_env_config(data):
    data = dict(data)
    taskset = dict(data.pop("taskset", {}) or {})
    agent = dict(data.pop("agent", {}) or {})
    if data:
        raise ValueError(f"1 validation error for SingleAgentEnvConfig\n{sorted(data)[0]}\n  "
                         "Extra inputs are not permitted")
    taskset_cls = _plugin(taskset.get("id", ""), Taskset, "taskset")
    taskset.pop("task", None)
    harness = agent.pop("harness", None)
    if harness is not None:
        harness_cls = _plugin(harness.get("id", ""), Harness, "harness")
        harness = harness_cls.config_type()(**harness)
    return EnvConfig(taskset=taskset_cls.config_type()(**taskset),
                     agent=AgentConfig(harness=harness, **agent))


def load_environment(config):
    return Env(config)


class _Interception:
    """The interception server: routes each harness call, by its secret, to its episode's
    model endpoint, and records the turn on the trace."""

    def __init__(self):
        self.sessions = {}
        sessions = self.sessions

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt, *args):
                return None

            def reply(self, status, data, ctype="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                secret = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                session = sessions.get(secret)
                if session is None:
                    return self.reply(401, b'{"error": "unauthorized"}')
                trace, ctx = session
                if trace.stop_condition is not None:
                    return self.reply(400, json.dumps({"error": {
                        "message": f"rollout stopped: {trace.stop_condition}"}}).encode())
                body = json.loads(raw)
                body["model"] = ctx.model
                req = urllib.request.Request(
                    ctx.client.base_url.rstrip("/") + "/chat/completions",
                    data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=3600) as r:
                        data, ctype = r.read(), r.headers.get("Content-Type")
                except urllib.error.HTTPError as e:
                    return self.reply(e.code, e.read())
                if trace.stop_condition is not None:
                    return self.reply(400, json.dumps({"error": {
                        "message": f"rollout stopped: {trace.stop_condition}"}}).encode())
                if body.get("stream"):
                    message = {"role": "assistant", "content": ""}
                    for line in data.decode().splitlines():
                        if line.startswith("data: {"):
                            for c in json.loads(line[6:]).get("choices") or []:
                                message["content"] += (c.get("delta") or {}).get("content") or ""
                else:
                    message = json.loads(data)["choices"][0]["message"]
                trace.messages = [Message(m) for m in body["messages"] + [message]]
                self.reply(200, data, ctype)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()


class Env:
    """The single-agent env: the taskset's tasks, played by its harness."""

    def __init__(self, config):
        self.config = config
        self.taskset = _plugin(config.taskset.id, Taskset, "taskset")(config.taskset)
        harness_config = config.agent.harness
        harness_cls = _plugin(config.taskset.id if harness_config is None else harness_config.id,
                              Harness, "harness")
        if harness_config is None:
            harness_config = harness_cls.config_type()(id=config.taskset.id)
        self.harness = harness_cls(harness_config)
        self._interception = None

    @contextlib.asynccontextmanager
    async def serving(self):
        self._interception = _Interception()
        try:
            yield
        finally:
            self._interception.close()
            self._interception = None

    async def run_episode(self, task, ctx, *, on_trace=None, on_discard=None):
        trace = Trace(task)
        if on_trace is not None:
            on_trace(trace)
        secret = uuid.uuid4().hex
        self._interception.sessions[secret] = (trace, ctx)
        try:
            try:
                result = await self.harness.launch(ctx, trace, None, self._interception.endpoint,
                                                   secret, {}, task.data)
            except Exception as e:
                raise HarnessError(f"harness {self.harness.config.id!r}: {e}") from e
            if result.exit_code != 0 and trace.stop_condition is None:
                raise HarnessError(f"harness {self.harness.config.id!r} exited "
                                   f"{result.exit_code}: {result.stderr[-2000:]}")
            trace.stop("agent_completed")
            await task.score(trace)
            trace.ok = True
        except RolloutError as e:
            trace.record_error(e)
        finally:
            self._interception.sessions.pop(secret, None)
        return Episode(traces=[trace], ok=trace.ok)


__all__ = ["AgentConfig", "Env", "EvalClientConfig", "Episode", "Error", "Harness",
           "HarnessConfig", "ModelContext", "ProgramResult", "Reward", "Task", "TaskConfig",
           "TaskData", "Taskset", "TasksetConfig", "Trace", "load_environment", "metric",
           "resolve_env_config", "reward"]

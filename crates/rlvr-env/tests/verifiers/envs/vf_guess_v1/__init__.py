"""A verifiers.v1 environment (`vf-guess-v1`, verifiers 0.4.0) as a prime-rl user writes one: a
taskset of number-guessing tasks whose `@vf.reward` functions score the trace, and a harness that
runs its chat loop in-process (as v1 allows: every model call goes through the interception
`endpoint`), answering each guess with "Higher." or "Lower." until it is right or `max_turns`.
`env_args` are the taskset's config (`broken_reward = true` makes a reward function raise).
With harness option `tools = true` the harness offers an OpenAI `add` tool and answers the model's
calls to it; `stream = true` asks for server-sent events; `rewrite_history = true` drops the
earlier turns from its next call (which rlvr refuses).

rlvr's tests run it through examples/verifiers_env.py with the stand-in package
(crates/rlvr-env/tests/verifiers/standin_v1); scripts/check_verifiers_env.py runs it with
verifiers 0.4.0 itself. Only the standard library calls the endpoint (urllib, a thread per call).
"""
import asyncio
import json
import re
import threading
import urllib.error
import urllib.request

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    answer: int = 0
    broken: bool = False


def last_number(text):
    nums = re.findall(r"-?\d+", text or "")
    return int(nums[-1]) if nums else None


def text(message):
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(getattr(p, "text", "") for p in content or [])


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def correct(self, task, trace) -> float:
        """1 when the last guess is the number."""
        replies = trace.assistant_messages
        if task.broken:
            return 1.0 / 0
        return 1.0 if replies and last_number(text(replies[-1])) == task.answer else 0.0

    @vf.reward(weight=0.5)
    async def quick(self, trace) -> float:
        """1 / the number of guesses."""
        return 1.0 / max(1, len(trace.assistant_messages))

    @vf.metric
    async def guesses(self, trace) -> float:
        return float(len(trace.assistant_messages))


class GuessTasksetConfig(vf.TasksetConfig):
    broken_reward: bool = False


class GuessTaskset(vf.Taskset[GuessTask, GuessTasksetConfig]):
    def load(self):
        for question, answer in [("Guess my number from 1 to 10.", 7),
                                 ("Guess my number from 1 to 10 again.", 3)]:
            data = GuessData(prompt=question, system_prompt="Answer with one number.",
                             answer=answer, broken=self.config.broken_reward)
            yield GuessTask(data, self.config.task)


ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


async def in_thread(fn, *args):
    """`fn(*args)` in a thread of its own: a model call waits while rlvr samples the whole batch,
    so the live episodes' calls must not queue for a bounded pool (asyncio.to_thread's)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def work():
        try:
            result = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(done.set_exception, e)
        else:
            loop.call_soon_threadsafe(done.set_result, result)

    threading.Thread(target=work, daemon=True).start()
    return await done


class GuessHarnessConfig(vf.HarnessConfig):
    max_turns: int = 4
    tools: bool = False
    rewrite_history: bool = False
    stream: bool = False


class GuessHarness(vf.Harness[GuessHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})

        def post(body):
            req = urllib.request.Request(
                endpoint.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {secret}",
                         "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                raw = r.read().decode()
            if not body.get("stream"):
                return json.loads(raw)
            # Server-sent events: the deltas joined into one message.
            message = {"role": "assistant", "content": ""}
            for line in raw.splitlines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices") or []:
                    delta = choice.get("delta") or {}
                    message["content"] += delta.get("content") or ""
                    for call in delta.get("tool_calls") or []:
                        message.setdefault("tool_calls", []).append(
                            {k: v for k, v in call.items() if k != "index"})
            return {"choices": [{"message": message}]}

        for _ in range(self.config.max_turns):
            body = {"model": ctx.model, "messages": messages, "temperature": 0.3}
            if self.config.stream:
                body["stream"] = True
            if self.config.tools:
                body["tools"] = [ADD_TOOL]
            try:
                out = await in_thread(post, body)
            except urllib.error.HTTPError as e:
                # As a harness program does: the run ends on a refused call (a stop).
                return vf.ProgramResult(exit_code=1, stdout="", stderr=e.read().decode())
            reply = out["choices"][0]["message"]
            messages.append({k: v for k, v in reply.items() if v is not None})
            if reply.get("tool_calls"):
                for call in reply["tool_calls"]:
                    args = json.loads(call["function"]["arguments"])
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "content": str(args["a"] + args["b"])})
                continue
            guess = last_number(reply.get("content"))
            if guess == data.answer:
                break
            if self.config.rewrite_history:
                messages = messages[:1] + messages[-1:]
            messages.append({"role": "user",
                             "content": "Higher." if (guess or 0) < data.answer else "Lower."})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["GuessTaskset", "GuessHarness"]

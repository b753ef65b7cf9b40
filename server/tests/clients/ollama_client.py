"""Drives llama-hdd-server with the official `ollama` Python package: the model endpoints
(`list`, `show`, `ps`), chat (whole, streamed, `options`, `num_predict` cutting the reply,
`logprobs`, `think`), generate (whole, streamed, `context` given back and continued, `raw`),
`format` (a JSON schema and `"json"`), tools (accepted, a call forced through `format`, its
result fed back), embeddings (`embed`, `embeddings`), refused endpoints and fields, and
authentication with a Bearer key.

It starts the server itself (with `--api-key` and `--embedding --pooling mean`), prints one
line per check passed, and exits with status 1 at the first failed check, saying what failed.
The model (SmolLM2-135M-Instruct) is tiny and weak: the checks assert shapes and protocol
behaviour, never what the model says.

    pip install -r server/tests/clients/requirements.txt
    python3 server/tests/clients/ollama_client.py \\
        target/debug/llama-hdd-server models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/scratch

`cargo xtask clients` runs this script with `openai_client.py` and `anthropic_client.py`; CI
runs them.
"""

import json
import math
import sys
import urllib.request

import ollama

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
from harness import CheckFailed, Checks, Server, expect, main_guard, parse_args  # noqa: E402

# The key the server is started with; the client sends it as `Authorization: Bearer`.
API_KEY = "ollama-local-test-key"

# Greedy sampling: replies are the same whole or streamed.
GREEDY = {"temperature": 0}

# A schema whose values are bounded (an enum), so a weak model under its grammar finishes it.
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}},
    "required": ["city"],
    "additionalProperties": False,
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": CITY,
    },
}

# This model's chat template writes no tool-call markers, so the server reads a reply that is
# one JSON object `{"tool_call": {"name": .., "arguments": {..}}}` as a call: this schema,
# given as `format`, makes the model write one (Ollama has no `tool_choice`).
FORCE_WEATHER = {
    "type": "object",
    "properties": {
        "tool_call": {
            "type": "object",
            "properties": {"name": {"const": "get_weather"}, "arguments": CITY},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
    },
    "required": ["tool_call"],
    "additionalProperties": False,
}

ASK = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three colours of the rainbow."},
]


def expect_done(r, limit=None):
    """A final answer: `done`, a reason, and the figures (nanoseconds) filled in."""
    expect(r.done is True, r)
    expect(r.done_reason in ("stop", "length"), r)
    expect(r.created_at and r.created_at.endswith("Z"), r.created_at)
    expect(r.total_duration and r.total_duration > 0, r)
    expect(r.prompt_eval_count and r.prompt_eval_count > 0, r)
    expect(r.eval_count is not None and r.eval_duration is not None, r)
    if limit is not None:
        expect(0 < r.eval_count <= limit, r)
        expect((r.done_reason == "length") == (r.eval_count == limit), r)


def expect_refused(status, call):
    """`call()` raises `ollama.ResponseError` with `status` and a message."""
    try:
        call()
    except ollama.ResponseError as e:
        expect(e.status_code == status, (e.status_code, e.error))
        expect(isinstance(e.error, str) and e.error, e.error)
        return e.error
    raise CheckFailed(f"not refused with {status}")


def model_checks(checks, client, server):
    """list, show, ps, and /api/version (which the package does not wrap)."""
    with checks("list: the one model, with Ollama's details"):
        models = client.list().models
        expect(len(models) >= 1, models)
        m = models[0]
        expect(m.model and m.size > 0 and m.digest.startswith("sha256:"), m)
        expect(m.modified_at is not None, m)
        d = m.details
        expect(d.format == "gguf" and d.family == "llama", d)
        expect(d.parameter_size.endswith("M") and d.quantization_level, d)
        name = m.model

    with checks("show: details, metadata, template, parameters, capabilities"):
        s = client.show(name)
        expect(s.details.family == "llama", s.details)
        expect(s.modelinfo["general.architecture"] == "llama", s.modelinfo)
        expect(s.modelinfo["llama.context_length"] > 0, s.modelinfo)
        expect("im_start" in s.template, s.template)
        expect("temperature" in s.parameters, s.parameters)
        expect("completion" in s.capabilities and "embedding" in s.capabilities, s.capabilities)

    with checks("ps: the model is loaded, with its context"):
        loaded = client.ps().models
        expect(len(loaded) == 1 and loaded[0].model == name, loaded)
        expect(loaded[0].context_length > 0 and loaded[0].expires_at is not None, loaded[0])

    with checks("version: /api/version answers a version"):
        req = urllib.request.Request(
            f"{server.url}/api/version", headers={"Authorization": f"Bearer {API_KEY}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            version = json.load(r)["version"]
        expect(version.count(".") == 2, version)
    return name


def chat_checks(checks, client, model):
    """chat: whole, streamed, options, logprobs, think."""
    with checks("chat: a whole reply with the figures"):
        whole = client.chat(model=model, messages=ASK, options={**GREEDY, "num_predict": 24})
        expect(whole.message.role == "assistant" and whole.message.content, whole.message)
        expect(whole.model == model, whole.model)
        expect_done(whole, 24)

    with checks("chat: streamed chunks add up to the whole reply"):
        parts = list(
            client.chat(model=model, messages=ASK, options={**GREEDY, "num_predict": 24}, stream=True)
        )
        expect(all(not p.done for p in parts[:-1]) and parts[-1].done, [p.done for p in parts])
        text = "".join(p.message.content or "" for p in parts)
        expect(text == whole.message.content, (text, whole.message.content))
        expect_done(parts[-1], 24)
        expect(parts[-1].eval_count == whole.eval_count, parts[-1])

    with checks("chat: num_predict cuts the reply with done_reason length"):
        short = client.chat(model=model, messages=ASK, options={**GREEDY, "num_predict": 3})
        expect(whole.eval_count > 3, f"the whole reply is too short: {whole}")
        expect(short.eval_count == 3 and short.done_reason == "length", short)
        expect(whole.message.content.startswith(short.message.content), (short, whole))

    with checks("chat: options reach the sampler (a seed repeats a sampled reply)"):
        opts = {"temperature": 1.2, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 7,
                "repeat_penalty": 1.1, "repeat_last_n": 32, "presence_penalty": 0.2,
                "frequency_penalty": 0.2, "num_predict": 12, "stop": ["\n\n"],
                "num_ctx": 2048, "num_thread": 2}
        a = client.chat(model=model, messages=ASK, options=opts)
        b = client.chat(model=model, messages=ASK, options=opts)
        expect(a.message.content == b.message.content, (a.message, b.message))
        expect_done(a, 12)

    with checks("chat: logprobs of each token, with the alternatives asked for"):
        r = client.chat(model=model, messages=ASK, options={**GREEDY, "num_predict": 5},
                        logprobs=True, top_logprobs=2)
        expect(r.logprobs is not None and len(r.logprobs) == r.eval_count, r.logprobs)
        for lp in r.logprobs:
            expect(lp.logprob <= 0 and len(lp.top_logprobs) == 2, lp)
        expect("".join(lp.token for lp in r.logprobs) == r.message.content, r)

    with checks("chat: think is accepted (this model does not think)"):
        r = client.chat(model=model, messages=ASK, options={**GREEDY, "num_predict": 8},
                        think=True, keep_alive="10m")
        expect(r.message.content is not None and not r.message.thinking, r.message)
        expect_done(r, 8)


def generate_checks(checks, client, model):
    """generate: whole, streamed, context continued, raw."""
    with checks("generate: a reply and the context that continues it"):
        first = client.generate(model=model, prompt="Tell me about Paris.", system="Be brief.",
                                options={**GREEDY, "num_predict": 16})
        expect(first.response and first.context, first)
        expect_done(first, 16)
        expect(len(first.context) > first.eval_count, first.context)

    with checks("generate: streamed, the next turn continues the context"):
        parts = list(client.generate(model=model, prompt="And London?", context=first.context,
                                     options={**GREEDY, "num_predict": 8}, stream=True))
        last = parts[-1]
        expect_done(last, 8)
        expect("".join(p.response for p in parts[:-1]) and last.response == "", parts)
        expect(list(last.context[: len(first.context)]) == list(first.context), last.context)
        # The first turn came from the prompt cache: only the new turn was evaluated.
        expect(last.prompt_eval_count < len(first.context), last)

    with checks("generate: raw prompts are sent as they are"):
        raw = client.generate(
            model=model, raw=True, options={**GREEDY, "num_predict": 8},
            prompt="<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        )
        expect(raw.response and raw.done, raw)


def format_checks(checks, client, model):
    """format: a JSON schema (validated), and "json"."""
    with checks("format: a JSON schema gives a reply that follows it"):
        r = client.chat(model=model, format=CITY, options={**GREEDY, "num_predict": 64},
                        messages=[{"role": "user", "content": "Which city is the capital of France?"}])
        value = json.loads(r.message.content)
        expect(value.get("city") in CITY["properties"]["city"]["enum"], value)
        expect(r.done_reason == "stop", r)

    with checks('format: "json" gives a JSON object'):
        r = client.generate(model=model, format="json", options={**GREEDY, "num_predict": 64},
                            prompt="Give the colours of the French flag as JSON.")
        expect(r.response.lstrip().startswith("{"), r.response)
        if r.done_reason == "stop":
            expect(isinstance(json.loads(r.response), dict), r.response)


def tool_checks(checks, client, model):
    """tools: accepted, a call (forced through format) with object arguments, its result back."""
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]

    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
          city: The city
        """
        return f"Sunny in {city}"

    with checks("tools: a request with tools (a function and a dict) is answered"):
        r = client.chat(model=model, messages=ask, tools=[get_weather, WEATHER],
                        options={**GREEDY, "num_predict": 48})
        expect(r.message.content or r.message.tool_calls, r.message)
        expect_done(r, 48)

    with checks("tools: a call comes back with its arguments as an object"):
        r = client.chat(model=model, messages=ask, tools=[WEATHER], format=FORCE_WEATHER,
                        options={**GREEDY, "num_predict": 128})
        calls = r.message.tool_calls or []
        expect(len(calls) == 1 and calls[0].function.name == "get_weather", r.message)
        args = calls[0].function.arguments
        expect(isinstance(args, dict) and args.get("city") in ("Paris", "London", "Tokyo"), args)

    with checks("tools: the call streamed is the call whole"):
        parts = list(client.chat(model=model, messages=ask, tools=[WEATHER], format=FORCE_WEATHER,
                                 options={**GREEDY, "num_predict": 128}, stream=True))
        streamed = [c for p in parts for c in (p.message.tool_calls or [])]
        expect(len(streamed) == 1 and streamed[0].function == calls[0].function, streamed)

    with checks("tools: the result fed back gives the next reply"):
        history = ask + [
            r.message,
            {"role": "tool", "tool_name": "get_weather", "content": get_weather(**args)},
        ]
        reply = client.chat(model=model, messages=history, tools=[WEATHER],
                            options={**GREEDY, "num_predict": 24})
        expect(reply.message.content and not reply.message.tool_calls, reply.message)
        expect_done(reply, 24)


def embedding_checks(checks, client, model):
    """embed (unit vectors, dimensions) and the older embeddings."""
    with checks("embed: one unit vector an input, in order"):
        r = client.embed(model=model, input=["Hello world", "Goodbye"])
        expect(len(r.embeddings) == 2 and len(r.embeddings[0]) > 0, len(r.embeddings))
        norm = math.sqrt(sum(x * x for x in r.embeddings[0]))
        expect(abs(norm - 1) < 1e-3, norm)
        expect(r.prompt_eval_count and r.prompt_eval_count >= 2, r.prompt_eval_count)
        one = client.embed(model=model, input="Hello world")
        expect(max(abs(a - b) for a, b in zip(one.embeddings[0], r.embeddings[0])) < 1e-4, "order")
        cut = client.embed(model=model, input="Hello world", dimensions=8)
        expect(len(cut.embeddings[0]) == 8, len(cut.embeddings[0]))

    with checks("embeddings: the older endpoint's one vector"):
        r = client.embeddings(model=model, prompt="Hello world")
        expect(len(r.embedding) == len(one.embeddings[0]), len(r.embedding))


def refusal_checks(checks, client, model):
    """What this server does not do is refused in Ollama's shape, with a reason."""
    with checks("refused: pull, create, copy and delete (one model, the one started with)"):
        for call in (
            lambda: client.pull("llama3.2"),
            lambda: client.create(model="mine", from_=model),
            lambda: client.copy(model, "copy"),
            lambda: client.delete(model),
        ):
            message = expect_refused(501, call)
            expect("started with" in message, message)

    with checks("refused: images, by name"):
        message = expect_refused(400, lambda: client.chat(model=model, messages=[
            {"role": "user", "content": "What is this?", "images": [b"\x89PNG\r\n"]}]))
        expect("images" in message, message)


def main():
    args = parse_args(__doc__.split("\n\n")[0])
    checks = Checks("ollama client", args.scratch)
    extra = ["--api-key", API_KEY, "--embedding", "--pooling", "mean"]
    server = Server(args.server, args.model, args.scratch, "ollama", extra)
    with server:
        with checks("the server starts with --api-key and --embedding and answers /health"):
            server.start()
        # The package sends `headers` with every request.
        client = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                               timeout=300)

        with checks("auth: a wrong key is refused with 401"):
            wrong = ollama.Client(host=server.url, headers={"Authorization": "Bearer wrong"})
            message = expect_refused(401, wrong.list)
            expect("API key" in message, message)

        model = model_checks(checks, client, server)
        chat_checks(checks, client, model)
        generate_checks(checks, client, model)
        format_checks(checks, client, model)
        tool_checks(checks, client, model)
        embedding_checks(checks, client, model)
        refusal_checks(checks, client, model)
        with checks("the server stops cleanly on SIGTERM"):
            server.stop()
    checks.done()


if __name__ == "__main__":
    main_guard(main)

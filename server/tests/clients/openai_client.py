"""Drives llama-hdd-server with the official `openai` Python package: models, chat (whole,
streamed, cached), completions, tools (forced, named, automatic, streamed, results fed back,
parallel calls), the Responses API (text, streamed events, function calls and their outputs,
`previous_response_id`, continued across a restart from the prompt cache, retrieve, delete)
and embeddings (on a second server started with `--embedding`).

It starts the server itself, prints one line per check passed, and exits with status 1 at the
first failed check, saying what failed. The model (SmolLM2-135M-Instruct) is tiny and weak: the
checks assert shapes and protocol behaviour, never what the model says.

    pip install -r server/tests/clients/requirements.txt
    python3 server/tests/clients/openai_client.py \\
        target/debug/llama-hdd-server models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/scratch

`cargo xtask clients` runs this script and `anthropic_client.py`; CI runs them.
"""

import base64
import json
import math
import struct
import sys

import openai
from openai import OpenAI

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
from harness import CheckFailed, Checks, Server, expect, main_guard, parse_args  # noqa: E402

# The tools of the tool checks. Their arguments are bounded (enums, `maxLength`) and closed
# (`additionalProperties: false`): a forced call is constrained by a grammar built from the
# schema, and bounds keep a weak model from rambling inside a string until `max_tokens` cuts
# the call short.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 16}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]

# The same tools in the Responses API's flat form.
RESPONSE_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]

# Enough tokens for one call of the tools above (about 50 tokens each), with room to spare,
# and for several parallel calls.
CALL_TOKENS = 128
PARALLEL_TOKENS = 320

# Greedy, seeded sampling: the same request gives the same reply, whole or streamed.
GREEDY = {"temperature": 0, "seed": 1}


def schema_of(name):
    """The parameters schema of the tool called `name`."""
    for t in TOOLS:
        if t["function"]["name"] == name:
            return t["function"]["parameters"]
    raise CheckFailed(f"no tool named {name!r}")


def check_call(name, arguments, allowed):
    """A tool call is well formed: its name is one of `allowed` and its arguments are a JSON
    object with the schema's required keys. Returns the arguments."""
    expect(name in allowed, f"tool call names {name!r}, not one of {allowed}")
    try:
        args = json.loads(arguments)
    except (TypeError, json.JSONDecodeError) as e:
        raise CheckFailed(f"arguments of {name} are not JSON ({e}): {arguments!r}") from None
    expect(isinstance(args, dict), f"arguments of {name} are not an object: {arguments!r}")
    missing = set(schema_of(name)["required"]) - set(args)
    expect(not missing, f"arguments of {name} lack required {sorted(missing)}: {arguments!r}")
    return args


def check_message_calls(message, allowed):
    """Every tool call of a chat message is well formed; returns them as (name, arguments)."""
    calls = message.tool_calls or []
    ids = [c.id for c in calls]
    expect(all(ids) and len(set(ids)) == len(ids), f"tool call ids missing or repeated: {ids}")
    for c in calls:
        expect(c.type == "function", c)
        check_call(c.function.name, c.function.arguments, allowed)
    return [(c.function.name, c.function.arguments) for c in calls]


def reassemble_calls(stream):
    """Tool calls put together from streamed `delta.tool_calls` chunks, by index, and the
    finish reason. Each call's first chunk carries its id and name; arguments come in pieces."""
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                if d.id:
                    expect(call["id"] is None, f"call {d.index} got a second id: {d}")
                    call["id"] = d.id
                if d.function:
                    call["name"] += d.function.name or ""
                    call["arguments"] += d.function.arguments or ""
    expect(sorted(calls) == list(range(len(calls))), f"call indices not 0..n: {sorted(calls)}")
    return [calls[i] for i in sorted(calls)], finish


def output_calls(response):
    """The function call items of a Responses output."""
    return [o for o in response.output if o.type == "function_call"]


def chat_checks(checks, client, model):
    """Chat completions, completions, and the prompt cache seen through `usage`."""
    messages = [{"role": "user", "content": "What is the tallest mountain in the world?"}]
    with checks("chat: a whole reply"):
        whole = client.chat.completions.create(
            model=model, messages=messages, max_tokens=16, **GREEDY
        )
        text = whole.choices[0].message.content
        expect(isinstance(text, str) and text, whole)
        expect(whole.choices[0].message.role == "assistant", whole)
        expect(whole.choices[0].finish_reason in ("stop", "length"), whole)
        expect(0 < whole.usage.completion_tokens <= 16, whole.usage)

    with checks("chat: streamed equals whole at temperature 0, usage on request"):
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=16, stream=True,
            stream_options={"include_usage": True}, **GREEDY,
        )
        chunks = list(stream)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        expect(streamed == text, (streamed, text))
        usage = [c.usage for c in chunks if c.usage]
        expect(usage and usage[-1].completion_tokens == whole.usage.completion_tokens, usage)

    with checks("chat: a repeated prompt comes from the cache"):
        again = client.chat.completions.create(
            model=model, messages=messages, max_tokens=16, **GREEDY
        )
        cached = again.usage.prompt_tokens_details.cached_tokens
        expect(cached and cached > 0, again.usage)
        expect(again.choices[0].message.content == text, again)

    with checks("completions: whole and streamed agree"):
        prompt = "The capital of France is"
        done = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
        expect(done.choices[0].text, done)
        pieces = client.completions.create(
            model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True
        )
        streamed = "".join(c.choices[0].text for c in pieces if c.choices)
        expect(streamed == done.choices[0].text, (streamed, done.choices[0].text))


def tool_checks(checks, client, model):
    """Tools on chat completions: forced, named, automatic, streamed, results, parallel."""
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    names = [t["function"]["name"] for t in TOOLS]

    def call(messages, **kw):
        if "max_completion_tokens" not in kw:
            kw.setdefault("max_tokens", CALL_TOKENS)
        return client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, **GREEDY, **kw
        )

    with checks('tools: tool_choice="required" gives a well-formed call'):
        r = call(ask, tool_choice="required", parallel_tool_calls=False)
        choice = choice_required = r.choices[0]
        expect(choice.finish_reason == "tool_calls", choice)
        expect(len(choice.message.tool_calls or []) == 1, choice.message)
        check_message_calls(choice.message, names)
        expect(not choice.message.content, choice.message)

    with checks("tools: a named tool_choice calls that function"):
        named = {"type": "function", "function": {"name": "get_time"}}
        r = call(ask, tool_choice=named, parallel_tool_calls=False)
        expect(r.choices[0].finish_reason == "tool_calls", r.choices[0])
        calls = check_message_calls(r.choices[0].message, ["get_time"])
        expect(len(calls) == 1, calls)

    with checks('tools: tool_choice="auto" gives text or well-formed calls'):
        # Text or a call: either is right. The token cap only keeps a rambling reply short.
        r = call(ask, tool_choice="auto", max_tokens=64)
        choice = r.choices[0]
        calls = check_message_calls(choice.message, names)
        expect(calls or isinstance(choice.message.content, str), choice)
        expect(choice.finish_reason in ("stop", "length", "tool_calls"), choice)

    with checks("tools: streamed calls, reassembled, equal the whole ones (parallel)"):
        # Two cities: at temperature 0 this model makes several calls, so indices > 0 stream.
        both = [{"role": "user", "content": "Weather in Paris and Tokyo, please."}]
        parallel = {"tool_choice": "required", "parallel_tool_calls": True}
        whole = call(both, **parallel, max_tokens=PARALLEL_TOKENS)
        want = check_message_calls(whole.choices[0].message, names)
        expect(want, whole)
        streamed, finish = reassemble_calls(
            call(both, **parallel, max_tokens=PARALLEL_TOKENS, stream=True)
        )
        expect(finish == "tool_calls", finish)
        expect(all(c["id"] for c in streamed), streamed)
        got = [(c["name"], c["arguments"]) for c in streamed]
        expect(got == want, {"streamed": got, "whole": want})

    with checks("tools: parallel_tool_calls=false allows exactly one call"):
        r = call(both, tool_choice="required", parallel_tool_calls=False)
        expect(len(check_message_calls(r.choices[0].message, names)) == 1, r.choices[0].message)

    with checks("tools: a role=tool result fed back gives the next reply"):
        first = choice_required.message.tool_calls[0]
        history = ask + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": first.id,
                        "type": "function",
                        "function": {
                            "name": first.function.name,
                            "arguments": first.function.arguments,
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": first.id, "content": '{"temperature": 21}'},
        ]
        r = call(history, tool_choice="none", max_completion_tokens=16)
        reply = r.choices[0].message
        expect(r.usage.completion_tokens <= 16, r.usage)
        expect(isinstance(reply.content, str) and reply.content, reply)
        expect(not reply.tool_calls, reply)
        # The question was asked before: the start of this prompt came from the cache.
        expect(r.usage.prompt_tokens_details.cached_tokens > 0, r.usage)


def responses_checks(checks, client, model, server):
    """The Responses API, up to a conversation continued after a restart."""
    with checks("responses: a text response"):
        r = client.responses.create(
            model=model, input="Say hello.", instructions="You are terse.",
            max_output_tokens=16, temperature=0,
        )
        expect(r.object == "response" and r.id.startswith("resp_"), r)
        expect(r.status in ("completed", "incomplete"), r)
        expect([o.type for o in r.output] == ["message"], r.output)
        expect(r.output_text, r)
        expect(r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 16, r.usage)
        expect(r.instructions == "You are terse.", r.instructions)

    with checks("responses: streamed events in order, the text equals the whole one"):
        events = list(
            client.responses.create(
                model=model, input="Say hello.", instructions="You are terse.",
                max_output_tokens=16, temperature=0, stream=True,
            )
        )
        kinds = [e.type for e in events]
        expect(kinds[:2] == ["response.created", "response.in_progress"], kinds)
        expect(kinds[-1] == "response.completed", kinds)
        for want in ("response.output_item.added", "response.output_text.delta",
                     "response.output_text.done", "response.output_item.done"):
            expect(want in kinds, f"no {want} in {kinds}")
        numbers = [e.sequence_number for e in events]
        expect(numbers == sorted(set(numbers)), f"sequence numbers out of order: {numbers}")
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = events[-1].response
        expect(deltas == final.output_text == r.output_text, (deltas, final.output_text, r))

    ask = "What's the weather in Paris?"
    with checks("responses: a forced function call item"):
        called = client.responses.create(
            model=model, input=ask, instructions="Answer with the tools.",
            tools=RESPONSE_TOOLS, tool_choice="required", parallel_tool_calls=False,
            max_output_tokens=CALL_TOKENS, temperature=0,
        )
        calls = output_calls(called)
        expect(len(calls) == 1, called.output)
        item = calls[0]
        expect(item.call_id and item.status == "completed", item)
        check_call(item.name, item.arguments, [t["name"] for t in RESPONSE_TOOLS])

    with checks("responses: a streamed named function call equals the whole one"):
        named = {"type": "function", "name": item.name}
        with client.responses.stream(
            model=model, input=ask, instructions="Answer with the tools.",
            tools=RESPONSE_TOOLS, tool_choice=named, parallel_tool_calls=False,
            max_output_tokens=CALL_TOKENS, temperature=0,
        ) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_response()
        expect("response.function_call_arguments.delta" in kinds, kinds)
        expect("response.function_call_arguments.done" in kinds, kinds)
        got = [(c.name, c.arguments) for c in output_calls(final)]
        expect(got == [(item.name, item.arguments)], (got, item))

    with checks("responses: a function_call_output continues by previous_response_id"):
        answered = client.responses.create(
            model=model, previous_response_id=called.id, tools=RESPONSE_TOOLS,
            input=[{"type": "function_call_output", "call_id": item.call_id,
                    "output": json.dumps({"temperature": 21, "sky": "clear"})}],
            max_output_tokens=16, temperature=0,
        )
        expect(answered.previous_response_id == called.id, answered)
        expect(answered.output_text or output_calls(answered), answered.output)
        # The earlier turns were the start of this prompt: they came from the cache.
        grew = answered.usage.input_tokens > called.usage.input_tokens
        expect(grew, (answered.usage, called.usage))
        expect(answered.usage.input_tokens_details.cached_tokens > 0, answered.usage)

    with checks("responses: a text turn continues by previous_response_id"):
        last = client.responses.create(
            model=model, previous_response_id=answered.id, input="Thanks! And tomorrow?",
            max_output_tokens=8, temperature=0,
        )
        expect(last.previous_response_id == answered.id and last.output_text, last)

    with checks("responses: the server stops on SIGTERM and starts on the same cache"):
        server.restart()

    with checks("responses: previous_response_id continues after the restart from the cache"):
        # The first request after the restart: nothing is in memory, so cached tokens were
        # read from the cache directory on disk.
        after = client.responses.create(
            model=model, previous_response_id=last.id, input="Thank you.",
            max_output_tokens=8, temperature=0,
        )
        expect(after.previous_response_id == last.id, after)
        expect(after.usage.input_tokens > last.usage.input_tokens, (after.usage, last.usage))
        cached = after.usage.input_tokens_details.cached_tokens
        expect(cached > 0, f"no cached tokens after the restart: {after.usage}")
        print(f"     ({cached} of {after.usage.input_tokens} input tokens came from the cache)")

    with checks("responses: retrieve and delete a response made before the restart"):
        got = client.responses.retrieve(last.id)
        expect(got.id == last.id and got.output_text == last.output_text, (got, last))
        client.responses.delete(last.id)
        try:
            client.responses.retrieve(last.id)
        except openai.NotFoundError:
            pass
        else:
            raise CheckFailed(f"{last.id} is still there after delete")


def embedding_checks(checks, args):
    """`/v1/embeddings` on a server started with `--embedding --pooling mean`."""
    server = Server(args.server, args.model, args.scratch, "openai-embeddings",
                    ["--embedding", "--pooling", "mean"])
    with server:
        with checks("embeddings: a server with --embedding --pooling mean starts"):
            server.start()
            client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
            model = client.models.list().data[0].id

        with checks("embeddings: one input, float, unit length"):
            r = client.embeddings.create(model=model, input="Hello world", encoding_format="float")
            expect(r.object == "list" and len(r.data) == 1, r)
            vector = r.data[0].embedding
            expect(len(vector) > 0 and all(isinstance(x, float) for x in vector), vector[:4])
            norm = math.sqrt(sum(x * x for x in vector))
            expect(abs(norm - 1) < 1e-3, f"|v| = {norm}")
            expect(r.usage.prompt_tokens > 0, r.usage)

        with checks("embeddings: a list of inputs, in order"):
            r = client.embeddings.create(
                model=model, input=["Hello world", "Goodbye", "A third one"],
                encoding_format="float",
            )
            expect([d.index for d in r.data] == [0, 1, 2], r.data)
            lengths = [len(d.embedding) for d in r.data]
            expect(lengths == [len(vector)] * 3, lengths)
            expect(max(abs(a - b) for a, b in zip(r.data[0].embedding, vector)) < 1e-4,
                   "the first of a list differs from the same text alone")

        with checks('embeddings: encoding_format="base64" is the float vector'):
            r = client.embeddings.create(model=model, input="Hello world", encoding_format="base64")
            raw = base64.b64decode(r.data[0].embedding)
            expect(len(raw) == 4 * len(vector), f"{len(raw)} bytes for {len(vector)} floats")
            decoded = struct.unpack(f"<{len(vector)}f", raw)
            expect(max(abs(a - b) for a, b in zip(decoded, vector)) < 1e-5, "base64 != float")
            # The package's default asks for base64 and decodes it itself.
            default = client.embeddings.create(model=model, input="Hello world")
            expect(len(default.data[0].embedding) == len(vector), default.data[0])

        with checks("embeddings: the server stops cleanly on SIGTERM"):
            server.stop()


def main():
    args = parse_args(__doc__.split("\n\n")[0])
    checks = Checks("openai client", args.scratch)
    server = Server(args.server, args.model, args.scratch, "openai")
    with server:
        with checks("the server starts and answers /health"):
            server.start()
        # No retries: a failed request is a failed check, not a slow one.
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
        with checks("models: one model is listed"):
            models = client.models.list()
            expect(len(models.data) == 1 and models.data[0].object == "model", models)
            model = models.data[0].id
        chat_checks(checks, client, model)
        tool_checks(checks, client, model)
        responses_checks(checks, client, model, server)
        with checks("the server stops cleanly on SIGTERM"):
            server.stop()
    embedding_checks(checks, args)
    checks.done()


if __name__ == "__main__":
    main_guard(main)

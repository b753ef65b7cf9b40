"""Drives llama-hdd-server with the official `anthropic` Python package: the Messages API
(system, `max_tokens`, `stop_sequences`), streaming (the text stream, the final message, the
events in order), `count_tokens`, tools (`tool_choice` any and a named tool, streamed tool use,
`tool_result` blocks fed back) and authentication with `x-api-key`.

It starts the server itself with `--api-key`, prints one line per check passed, and exits with
status 1 at the first failed check, saying what failed. The model (SmolLM2-135M-Instruct) is
tiny and weak: the checks assert shapes and protocol behaviour, never what the model says.

    pip install -r server/tests/clients/requirements.txt
    python3 server/tests/clients/anthropic_client.py \\
        target/debug/llama-hdd-server models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/scratch

`cargo xtask clients` runs this script and `openai_client.py`; CI runs them.
"""

import sys

import anthropic

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
from harness import CheckFailed, Checks, Server, expect, main_guard, parse_args  # noqa: E402

# The key the server is started with; the client sends it as `x-api-key`.
API_KEY = "sk-ant-local-test-key"

# The package has no `temperature` argument any more; the server reads llama.cpp's sampling
# fields from the body, so greedy sampling travels as an extra body field. Greedy replies are
# the same whole or streamed.
GREEDY = {"extra_body": {"temperature": 0}}

# The tools of the tool checks. Their inputs are bounded (enums, `maxLength`) and closed: a
# forced call is constrained by a grammar built from the schema, and bounds keep a weak model
# from rambling inside a string until `max_tokens` cuts the call short.
TOOLS = [
    {
        "name": "get_weather",
        "description": "The current weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
    {
        "name": "get_time",
        "description": "The current time in a time zone",
        "input_schema": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 16}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
]
NAMES = [t["name"] for t in TOOLS]

# Enough tokens for one call of the tools above (about 50 tokens), with room to spare.
CALL_TOKENS = 128

ASK_WEATHER = [{"role": "user", "content": "What's the weather in Paris?"}]


def text_of(message):
    """The text blocks of a message, joined."""
    return "".join(b.text for b in message.content if b.type == "text")


def tool_uses(message, allowed):
    """The tool_use blocks of a message, each checked: an id, a name among `allowed`, and an
    input object with the schema's required keys."""
    uses = [b for b in message.content if b.type == "tool_use"]
    for b in uses:
        expect(b.id, f"a tool_use block without an id: {b}")
        expect(b.name in allowed, f"tool_use names {b.name!r}, not one of {allowed}")
        expect(isinstance(b.input, dict), f"tool_use input is not an object: {b}")
        schema = next(t["input_schema"] for t in TOOLS if t["name"] == b.name)
        missing = set(schema["required"]) - set(b.input)
        expect(not missing, f"tool_use input lacks required {sorted(missing)}: {b.input}")
    ids = [b.id for b in uses]
    expect(len(set(ids)) == len(ids), f"repeated tool_use ids: {ids}")
    return uses


def check_event_order(kinds):
    """Raw stream events: message_start, then blocks (content_block_start, deltas,
    content_block_stop), then message_delta and message_stop."""
    expect(kinds and kinds[0] == "message_start", kinds)
    expect(kinds[-2:] == ["message_delta", "message_stop"], kinds)
    open_block = False
    for k in kinds[1:-2]:
        if k == "content_block_start":
            expect(not open_block, f"a block started inside another: {kinds}")
            open_block = True
        elif k == "content_block_delta":
            expect(open_block, f"a delta outside a block: {kinds}")
        elif k == "content_block_stop":
            expect(open_block, f"a block stopped that was not open: {kinds}")
            open_block = False
        else:
            raise CheckFailed(f"unexpected event {k!r} among the blocks: {kinds}")
    expect(not open_block and "content_block_start" in kinds, kinds)


def message_checks(checks, client, model):
    """Messages: system, max_tokens, stop_sequences, streaming, count_tokens."""
    system = "You are a terse assistant."
    ask = [{"role": "user", "content": "Name three colours of the rainbow."}]

    with checks("messages: a reply with a system prompt"):
        whole = client.messages.create(
            model=model, system=system, messages=ask, max_tokens=24, **GREEDY
        )
        expect(whole.type == "message" and whole.role == "assistant", whole)
        expect(whole.id and whole.model, whole)
        expect([b.type for b in whole.content] == ["text"] and text_of(whole), whole.content)
        expect(whole.stop_reason in ("end_turn", "max_tokens"), whole)
        expect(0 < whole.usage.output_tokens <= 24, whole.usage)
        prompt = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
        expect(prompt > 0, whole.usage)
        text = text_of(whole)

    with checks("messages: max_tokens cuts the reply"):
        short = client.messages.create(
            model=model, system=system, messages=ask, max_tokens=3, **GREEDY
        )
        expect(whole.usage.output_tokens > 3, f"the whole reply is too short: {whole}")
        expect(short.stop_reason == "max_tokens", short)
        expect(short.usage.output_tokens == 3, short.usage)

    with checks("messages: stop_sequences end the reply before the sequence"):
        # A piece of the greedy reply's middle: the same request stops just before it.
        middle = len(text) // 2
        sequence = text[middle:middle + 3]
        expect(len(sequence) == 3 and text.index(sequence) > 0, f"reply too short: {text!r}")
        stopped = client.messages.create(
            model=model, system=system, messages=ask, max_tokens=24,
            stop_sequences=["@@never@@", sequence], **GREEDY,
        )
        expect(stopped.stop_reason == "stop_sequence", stopped)
        expect(stopped.stop_sequence == sequence, stopped)
        expect(text_of(stopped) == text[: text.index(sequence)], (text_of(stopped), text, sequence))

    with checks("streaming: text_stream and the final message equal the whole reply"):
        with client.messages.stream(
            model=model, system=system, messages=ask, max_tokens=24, **GREEDY
        ) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        expect(streamed == text == text_of(final), (streamed, text, final))
        expect(final.stop_reason == whole.stop_reason, final)
        expect(final.usage.output_tokens == whole.usage.output_tokens, final.usage)

    with checks("streaming: raw events in order"):
        events = list(
            client.messages.create(
                model=model, system=system, messages=ask, max_tokens=8, stream=True, **GREEDY
            )
        )
        check_event_order([e.type for e in events])
        expect(events[0].message.role == "assistant" and events[0].message.content == [], events[0])
        deltas = [e.delta for e in events if e.type == "content_block_delta"]
        expect(all(d.type == "text_delta" for d in deltas), deltas)
        # Eight tokens cut the reply unless the whole one was that short.
        cut = "max_tokens" if whole.usage.output_tokens > 8 else whole.stop_reason
        expect(events[-2].delta.stop_reason == cut, (events[-2], whole.usage))

    with checks("count_tokens: the prompt's tokens, as usage counts them"):
        counted = client.messages.count_tokens(model=model, system=system, messages=ask)
        usage = whole.usage
        seen = usage.input_tokens + (usage.cache_read_input_tokens or 0)
        expect(counted.input_tokens == seen, (counted, usage))
        # A longer conversation counts more. (No system prompt is no shorter: this model's
        # template then writes a default one.)
        longer = ask + [
            {"role": "assistant", "content": text},
            {"role": "user", "content": "And three more?"},
        ]
        more = client.messages.count_tokens(model=model, system=system, messages=longer)
        expect(more.input_tokens > counted.input_tokens, (more, counted))


def tool_checks(checks, client, model):
    """Tools: forced (any, named), streamed, automatic, and a tool_result fed back."""

    def call(messages, **kw):
        kw.setdefault("max_tokens", CALL_TOKENS)
        return client.messages.create(model=model, messages=messages, tools=TOOLS, **GREEDY, **kw)

    with checks('tools: tool_choice {"type": "any"} gives a tool_use block'):
        forced = call(ASK_WEATHER, tool_choice={"type": "any", "disable_parallel_tool_use": True})
        uses = tool_uses(forced, NAMES)
        expect(len(uses) == 1, forced.content)
        expect(forced.stop_reason == "tool_use", forced)

    with checks('tools: tool_choice {"type": "tool", "name": ...} calls that tool'):
        choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
        named = call(ASK_WEATHER, tool_choice=choice)
        uses = tool_uses(named, ["get_weather"])
        expect(len(uses) == 1 and named.stop_reason == "tool_use", named)

    with checks("tools: streamed tool use equals the whole one"):
        with client.messages.stream(
            model=model, messages=ASK_WEATHER, tools=TOOLS, tool_choice=choice,
            max_tokens=CALL_TOKENS, **GREEDY,
        ) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_message()
        expect("input_json" in kinds, f"no input_json events: {kinds}")
        got = [(b.name, b.input) for b in tool_uses(final, ["get_weather"])]
        want = [(b.name, b.input) for b in uses]
        expect(got == want, {"streamed": got, "whole": want})
        expect(final.stop_reason == "tool_use", final)

    with checks('tools: tool_choice {"type": "auto"} gives text or tool_use'):
        auto = call(ASK_WEATHER, tool_choice={"type": "auto"}, max_tokens=64)
        expect(text_of(auto) or tool_uses(auto, NAMES), auto.content)
        expect(auto.stop_reason in ("end_turn", "max_tokens", "tool_use"), auto)

    with checks("tools: a tool_result block fed back gives the next reply"):
        use = tool_uses(forced, NAMES)[0]
        history = ASK_WEATHER + [
            {"role": "assistant", "content": forced.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "21 degrees, clear"},
                    {"type": "text", "text": "Summarise that in a sentence."},
                ],
            },
        ]
        reply = call(history, tool_choice={"type": "none"}, max_tokens=16)
        expect(text_of(reply) and not tool_uses(reply, NAMES), reply.content)
        expect(reply.stop_reason in ("end_turn", "max_tokens"), reply)
        # The conversation so far was the start of this prompt: it came from the cache.
        expect((reply.usage.cache_read_input_tokens or 0) > 0, reply.usage)


def main():
    args = parse_args(__doc__.split("\n\n")[0])
    checks = Checks("anthropic client", args.scratch)
    server = Server(args.server, args.model, args.scratch, "anthropic", ["--api-key", API_KEY])
    with server:
        with checks("the server starts with --api-key and answers /health"):
            server.start()
        # No retries: a failed request is a failed check, not a slow one.
        client = anthropic.Anthropic(
            base_url=server.url, api_key=API_KEY, max_retries=0, timeout=300
        )
        model = "SmolLM2-135M-Instruct"  # any name: the server has one model

        with checks("auth: a wrong x-api-key is an AuthenticationError"):
            wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
            try:
                wrong.messages.create(model=model, messages=ASK_WEATHER, max_tokens=1)
            except anthropic.AuthenticationError as e:
                expect(e.status_code == 401, e)
                expect(e.body["error"]["type"] == "authentication_error", e.body)
            else:
                raise CheckFailed("a request with a wrong key was answered")

        message_checks(checks, client, model)
        tool_checks(checks, client, model)
        with checks("the server stops cleanly on SIGTERM"):
            server.stop()
    checks.done()


if __name__ == "__main__":
    main_guard(main)

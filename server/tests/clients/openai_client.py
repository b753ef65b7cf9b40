"""Drives a running llama-hdd-server with the official `openai` Python package: chat, streamed
chat, completions and streamed completions. Exits non-zero on the first failed check.

    pip install openai
    cargo run --release -p server -- -m models/SmolLM2-135M-Instruct.Q4_1.gguf &
    python3 server/tests/openai_client.py http://127.0.0.1:8080/v1
"""

import sys

from openai import OpenAI


def main() -> None:
    base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
    client = OpenAI(base_url=base_url, api_key=sys.argv[2] if len(sys.argv) > 2 else "none")
    messages = [{"role": "user", "content": "What is the tallest mountain in the world?"}]

    models = client.models.list()
    assert len(models.data) == 1, models
    model = models.data[0].id

    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0, seed=1
    )
    text = whole.choices[0].message.content
    assert text, whole
    assert whole.usage.completion_tokens <= 16, whole.usage
    assert whole.choices[0].finish_reason in ("stop", "length"), whole

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0, seed=1, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == text, (streamed, text)

    again = client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0, seed=1
    )
    cached = again.usage.prompt_tokens_details.cached_tokens
    print(f"chat: {text!r}; cached tokens on the repeat: {cached}")

    done = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert done.choices[0].text, done
    pieces = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].text for c in pieces if c.choices)
    assert streamed == done.choices[0].text, (streamed, done.choices[0].text)
    print(f"completion: {done.choices[0].text!r}")
    print("openai client: all checks passed")


if __name__ == "__main__":
    main()

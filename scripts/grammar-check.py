#!/usr/bin/env python3
"""Constrained output against a running llama-hdd-server (or llama-server): N seeded requests,
half with a JSON schema, half with a GBNF grammar; every output must parse. Then the cost per
generated token, constrained against unconstrained, measured side by side: each constrained
request is followed by the same prompt without a grammar and the same number of tokens.

usage: grammar-check.py URL [N]      (prints a summary; exits 1 if any output does not parse)
"""
import json
import re
import statistics
import sys
import urllib.request

URL = sys.argv[1].rstrip("/")
N = int(sys.argv[2]) if len(sys.argv) > 2 else 200

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "colour", "tags"],
    "additionalProperties": False,
}
GBNF = r'''
root   ::= "[" ws item (ws "," ws item){0,4} ws "]"
item   ::= [0-9] [0-9]? | "\"" [a-z]{1,8} "\""
ws     ::= " "?
'''
GBNF_RE = re.compile(r'^\[ ?(\d\d?|"[a-z]{1,8}")( ?, ?(\d\d?|"[a-z]{1,8}")){0,4} ?\]$')


def post(body):
    req = urllib.request.Request(URL + "/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def valid_json(text):
    try:
        v = json.loads(text)
    except ValueError:
        return False
    return (isinstance(v, dict) and set(v) == set(SCHEMA["required"])
            and isinstance(v["name"], str) and isinstance(v["age"], int)
            and 0 <= v["age"] <= 120 and v["colour"] in SCHEMA["properties"]["colour"]["enum"]
            and isinstance(v["tags"], list) and all(isinstance(t, str) for t in v["tags"]))


bad = []
ratios = []
for seed in range(N):
    use_schema = seed % 2 == 0
    prompt = ("A person described as JSON:" if use_schema else "A short list:") + f" (#{seed})"
    body = {"prompt": prompt, "seed": seed, "temperature": 0.8, "n_predict": 96,
            "cache_prompt": False}
    body.update({"json_schema": SCHEMA} if use_schema else {"grammar": GBNF})
    r = post(body)
    text = r["content"]
    ok = valid_json(text) if use_schema else bool(GBNF_RE.match(text.strip()))
    if not ok:
        bad.append((seed, text))
    print(f"seed {seed}: {'ok' if ok else 'BAD'} {text!r}", flush=True)
    n = r["timings"]["predicted_n"]
    if n >= 4:
        free = post({"prompt": prompt, "seed": seed, "temperature": 0.8, "n_predict": n,
                     "ignore_eos": True, "cache_prompt": False})
        t_con = r["timings"]["predicted_ms"] / max(n - 1, 1)
        t_free = free["timings"]["predicted_ms"] / max(free["timings"]["predicted_n"] - 1, 1)
        ratios.append(t_con / t_free)
        print(f"  {n} tokens: {t_con:.2f} ms/token constrained, {t_free:.2f} unconstrained",
              flush=True)

print(f"{N - len(bad)} of {N} constrained outputs parse")
for seed, text in bad[:10]:
    print(f"  seed {seed}: {text!r}")
if ratios:
    print(f"time per token, constrained / unconstrained: median {statistics.median(ratios):.3f}, "
          f"p90 {sorted(ratios)[int(0.9 * (len(ratios) - 1))]:.3f} over {len(ratios)} pairs")
sys.exit(1 if bad else 0)

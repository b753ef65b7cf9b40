#!/usr/bin/env python3
"""Seed corpus for the server's `request` fuzz target: a few valid bodies of each endpoint.

Usage (from server/fuzz): python3 make_seeds.py

Each seed is a byte choosing the endpoint, a byte choosing the limits (0x3f: a body limit of
8 MiB, 3001 tokens, 17 positions, 4 slots), then the body; a `/slots` seed puts the path's id
and the query's action, each ended by a 0 byte, before its body.
"""
import json, os

CHAT, OPENAI, NATIVE, TOKENIZE, DETOKENIZE, TEMPLATE, SLOT = range(7)
SHAPE = 0x3f

def seeds():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    yield 'chat_plain', CHAT, {"messages": msgs}
    yield 'chat_sampling', CHAT, {"messages": msgs, "max_tokens": 8, "temperature": 0.2,
                                  "top_p": 0.9, "top_k": 20, "min_p": 0.1, "seed": 7,
                                  "repeat_penalty": 1.1, "frequency_penalty": 0.5,
                                  "presence_penalty": 0.5, "stop": ["\n", "END"],
                                  "stream": True, "id_slot": 1, "cache_prompt": False}
    yield 'chat_parts', CHAT, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "one "}, {"type": "text", "text": "two"}]}],
        "max_completion_tokens": 4, "n_predict": 2, "stop": "x", "ignore_eos": True}
    yield 'v1_text', OPENAI, {"prompt": "Once upon a time", "max_tokens": 16}
    yield 'v1_list', OPENAI, {"prompt": ["Once"], "n_predict": 3, "temperature": 0}
    yield 'native_tokens', NATIVE, {"prompt": [1, 2, 3], "n_predict": 4, "stream": True}
    yield 'native_text', NATIVE, {"prompt": "Hello", "seed": -1, "id_slot": -1}
    yield 'tokenize', TOKENIZE, {"content": "Hello <|im_start|> world", "add_special": True,
                                 "parse_special": False, "with_pieces": True}
    yield 'tokenize_plain', TOKENIZE, {"content": "x"}
    yield 'detokenize', DETOKENIZE, {"tokens": [0, 17, 3000]}
    yield 'template', TEMPLATE, {"messages": msgs}

def slot_seeds():
    yield 'slot_save', b'0\0save\0', {"filename": "chat1.v2"}
    yield 'slot_restore', b'3\0restore\0', {"filename": "a-b_c"}
    yield 'slot_erase', b'1\0erase\0', None

os.makedirs('corpus/request', exist_ok=True)
for name, endpoint, body in seeds():
    with open('corpus/request/' + name, 'wb') as f:
        f.write(bytes([endpoint, SHAPE]) + json.dumps(body).encode())
for name, head, body in slot_seeds():
    with open('corpus/request/' + name, 'wb') as f:
        f.write(bytes([SLOT, SHAPE]) + head + (b'' if body is None else json.dumps(body).encode()))

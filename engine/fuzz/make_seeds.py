#!/usr/bin/env python3
"""Seed corpora for the engine's fuzz targets, made from real files.

Usage (from engine/fuzz): python3 make_seeds.py ../../models/SmolLM2-135M-Instruct.Q4_1.gguf

Writes seeds/vocab.gguf (the model's metadata with no tensors: the tokenizer target's vocabulary)
and corpus/<target>/ seeds:
  gguf_reader    the vocabulary-only file and a tiny model
  model_load     tiny llama and qwen2 models (f32 weights, 4 heads, 2 layers, 40 tokens)
  tokenizer      the texts of ../tests/fixtures/tok_visible.jsonl
  chat_template  the model's chat template and ChatML, with two messages
"""
import json, os, struct, sys

def read_gguf_metadata(path):
    """Returns (version, raw bytes of all key/values, n_kv, chat template)."""
    with open(path, 'rb') as f:
        data = f.read(64 << 20)
    assert data[:4] == b'GGUF'
    version, n_tensors, n_kv = struct.unpack_from('<IQQ', data, 4)
    pos = 24
    fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    def skip(t, pos):
        if t in fixed:
            return pos + fixed[t]
        if t == 8:
            (n,) = struct.unpack_from('<Q', data, pos)
            return pos + 8 + n
        et, n = struct.unpack_from('<IQ', data, pos)
        pos += 12
        for _ in range(n):
            pos = skip(et, pos)
        return pos
    template = None
    for _ in range(n_kv):
        (kl,) = struct.unpack_from('<Q', data, pos)
        key = data[pos + 8:pos + 8 + kl].decode()
        pos += 8 + kl
        (t,) = struct.unpack_from('<I', data, pos)
        pos += 4
        start = pos
        pos = skip(t, pos)
        if key == 'tokenizer.chat_template':
            template = data[start + 8:pos]
    return version, data[24:pos], n_kv, template

def s(x):
    b = x.encode()
    return struct.pack('<Q', len(b)) + b

def kv(key, t, payload):
    return s(key) + struct.pack('<I', t) + payload

def tiny_model(arch):
    n_vocab, e, heads, kv_heads, ff, layers = 40, 16, 4, 2, 24, 2
    toks = [chr(ord('!') + i) for i in range(n_vocab)]
    kvs = [
        kv('general.architecture', 8, s(arch)),
        kv(arch + '.context_length', 4, struct.pack('<I', 64)),
        kv(arch + '.embedding_length', 4, struct.pack('<I', e)),
        kv(arch + '.block_count', 4, struct.pack('<I', layers)),
        kv(arch + '.feed_forward_length', 4, struct.pack('<I', ff)),
        kv(arch + '.attention.head_count', 4, struct.pack('<I', heads)),
        kv(arch + '.attention.head_count_kv', 4, struct.pack('<I', kv_heads)),
        kv(arch + '.attention.layer_norm_rms_epsilon', 6, struct.pack('<f', 1e-5)),
        kv(arch + '.rope.dimension_count', 4, struct.pack('<I', e // heads)),
        kv('tokenizer.ggml.model', 8, s('gpt2')),
        kv('tokenizer.ggml.pre', 8, s('smollm')),
        kv('tokenizer.ggml.tokens', 9, struct.pack('<IQ', 8, n_vocab) + b''.join(s(t) for t in toks)),
        kv('tokenizer.ggml.merges', 9, struct.pack('<IQ', 8, 1) + s('! "')),
        kv('tokenizer.ggml.eos_token_id', 4, struct.pack('<I', 0)),
    ]
    kvd = e // heads * kv_heads
    shapes = [('token_embd.weight', [e, n_vocab]), ('output_norm.weight', [e])]
    for l in range(layers):
        b = 'blk.%d.' % l
        shapes += [(b + 'attn_norm.weight', [e]), (b + 'attn_q.weight', [e, e]),
                   (b + 'attn_k.weight', [e, kvd]), (b + 'attn_v.weight', [e, kvd]),
                   (b + 'attn_output.weight', [e, e]), (b + 'ffn_norm.weight', [e]),
                   (b + 'ffn_gate.weight', [e, ff]), (b + 'ffn_up.weight', [e, ff]),
                   (b + 'ffn_down.weight', [ff, e])]
        if arch == 'qwen2':
            shapes += [(b + 'attn_q.bias', [e]), (b + 'attn_k.bias', [kvd]), (b + 'attn_v.bias', [kvd])]
    infos, datas, off = b'', b'', 0
    for name, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        infos += s(name) + struct.pack('<I', len(shape)) + b''.join(struct.pack('<Q', d) for d in shape)
        infos += struct.pack('<IQ', 0, off)
        blob = struct.pack('<%df' % n, *[((i * 7919) % 13 - 6) / 10 for i in range(n)])
        blob += b'\0' * (-len(blob) % 32)
        datas += blob
        off += len(blob)
    head = b'GGUF' + struct.pack('<IQQ', 3, len(shapes), len(kvs)) + b''.join(kvs) + infos
    head += b'\0' * (-len(head) % 32)
    return head + datas

def main():
    model = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    os.chdir(here)
    version, kvs, n_kv, template = read_gguf_metadata(model)
    vocab = b'GGUF' + struct.pack('<IQQ', version, 0, n_kv) + kvs
    os.makedirs('seeds', exist_ok=True)
    with open('seeds/vocab.gguf', 'wb') as f:
        f.write(vocab)
    def put(target, name, blob):
        os.makedirs('corpus/' + target, exist_ok=True)
        with open('corpus/%s/%s' % (target, name), 'wb') as f:
            f.write(blob)
    put('gguf_reader', 'vocab.gguf', vocab)
    for arch in ('llama', 'qwen2'):
        put('gguf_reader', 'tiny_%s.gguf' % arch, tiny_model(arch))
        put('model_load', 'tiny_%s.gguf' % arch, tiny_model(arch))
    with open('../tests/fixtures/tok_visible.jsonl', encoding='utf-8') as f:
        for i, line in enumerate(f):
            put('tokenizer', 'text_%03d' % i, json.loads(line)['text'].encode())
    chatml = (b"{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' + "
              b"message['content'] + '<|im_end|>\\n' -}}{%- endfor -%}"
              b"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
    msgs = b'\0system\x01You are helpful.\x02user\x01Hello, who are you?'
    put('chat_template', 'chatml', chatml + msgs)
    if template:
        put('chat_template', 'model', template + msgs)
    print('seeds written under', here)

main()

#!/usr/bin/env python3
"""A fake MCP server for the hub's tests: JSON-RPC 2.0 over stdio, one message per line.

Well-behaved tools: echo, add, fail_once, sleep (answers from a thread, so answers to
overlapping calls come back out of order). Hostile tools: crash (answers, then exits),
exit_mid (half an answer, then exits), flood (thousands of notifications, then the answer),
garbage (junk lines, non-UTF-8, a wrong id, a foreign id, then the answer), huge (a line over
the reader's cap, then the answer), ping_us (asks us for a ping and answers once it has ours),
hang (never answers), is_error (a tool-level error).

Options (argv): --hang-init (never answers initialize), --exit-init (exits at initialize),
--grandchild (starts a process that inherits the pipes and sleeps), --no-tools (an empty list),
--pages (tools/list in two pages), --stderr-spam (writes to stderr without end), --pid-file F
(writes its pid, and the grandchild's, to F), --mark F (creates F when a sleep call begins).
"""
import json
import os
import subprocess
import sys
import threading
import time

ARGS = sys.argv[1:]
OUT = sys.stdout.buffer
LOCK = threading.Lock()
STATE = {"fail_once": False, "pongs": {}}

TOOLS = [
    {"name": n, "description": "the " + n + " tool",
     "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}}
    for n in ["echo", "add", "fail_once", "sleep", "crash", "exit_mid", "flood", "garbage",
              "huge", "ping_us", "hang", "is_error", "pid"]
]


def send_raw(data):
    with LOCK:
        OUT.write(data)
        OUT.flush()


def send(msg):
    send_raw((json.dumps(msg) + "\n").encode())


def result(req_id, text, is_error=False):
    r = {"content": [{"type": "text", "text": text}]}
    if is_error:
        r["isError"] = True
    return {"jsonrpc": "2.0", "id": req_id, "result": r}


def call(req_id, name, args):
    if name == "echo":
        send(result(req_id, "echo: " + str(args.get("message", ""))))
    elif name == "add":
        send(result(req_id, str(args.get("a", 0) + args.get("b", 0))))
    elif name == "fail_once":
        if not STATE["fail_once"]:
            STATE["fail_once"] = True
            send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32000, "message": "transient error"}})
        else:
            send(result(req_id, "ok"))
    elif name == "sleep":
        if "--mark" in ARGS:
            open(ARGS[ARGS.index("--mark") + 1], "w").close()

        def later():
            time.sleep(float(args.get("seconds", 1)))
            send(result(req_id, "slept " + str(args.get("seconds", 1))))
        threading.Thread(target=later, daemon=True).start()
    elif name == "crash":
        send(result(req_id, "crashing"))
        os._exit(3)
    elif name == "exit_mid":
        send_raw(('{"jsonrpc": "2.0", "id": %d, "result": {"content": [{"type": "te' % req_id).encode())
        os._exit(4)
    elif name == "flood":
        note = (json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progress": 1}}) + "\n").encode()
        send_raw(note * int(args.get("count", 20000)))
        send(result(req_id, "after the flood"))
    elif name == "garbage":
        send_raw(b"THIS IS NOT JSON\n\xff\xfe\x00 not utf-8 \xc3\x28\n[1, 2, 3]\n\n   \r\n")
        send_raw(b'{"jsonrpc": "2.0", "id": "%d", "result": {}}\n' % req_id)
        send_raw(b'{"jsonrpc": "2.0", "id": %d, "result": {"content": []}}\n' % (req_id + 1000000))
        send_raw(b'{"jsonrpc": "2.0", "id": %d.5, "result": {}}\n' % req_id)
        send_raw(b'{"jsonrpc": "2.0", "id": %d, "result": {}, "error": {}}\n' % req_id)
        send_raw(b'{"jsonrpc": "2.0", "id": %d, "result": {"content": [{"type": "text", "text": "\xff"}]}}\n' % req_id)
        send(result(req_id, "after the garbage"))
    elif name == "huge":
        send_raw(b'{"jsonrpc": "2.0", "method": "x", "params": "' + b"a" * (9 << 20) + b'"}\n')
        send(result(req_id, "after the huge line"))
    elif name == "ping_us":
        send({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"})
        send({"jsonrpc": "2.0", "id": "srv-2", "method": "sampling/createMessage", "params": {}})
        STATE["pending_ping"] = req_id
    elif name == "hang":
        pass
    elif name == "is_error":
        send(result(req_id, "the tool failed", is_error=True))
    elif name == "pid":
        send(result(req_id, str(os.getpid())))
    else:
        send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32602, "message": "unknown tool " + str(name)}})


def main():
    if "--grandchild" in ARGS:
        gc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        if "--pid-file" in ARGS:
            with open(ARGS[ARGS.index("--pid-file") + 1], "w") as f:
                f.write("%d %d\n" % (os.getpid(), gc.pid))
    if "--stderr-spam" in ARGS:
        def spam():
            while True:
                sys.stderr.write("noise " * 1000 + "\n")
        threading.Thread(target=spam, daemon=True).start()
    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        method, req_id = msg.get("method"), msg.get("id")
        if method is None:
            # An answer to one of our own requests (ping_us).
            if req_id == "srv-2" and "pending_ping" in STATE:
                ok = "error" in msg and STATE["pongs"].get("srv-1") is not None
                send(result(STATE.pop("pending_ping"), "pong" if ok else "bad answers: " + json.dumps(STATE["pongs"])))
            else:
                STATE["pongs"][req_id] = msg
            continue
        if req_id is None:
            continue
        if method == "initialize":
            if "--hang-init" in ARGS:
                continue
            if "--exit-init" in ARGS:
                sys.stderr.write("cannot start: a fake failure\n")
                sys.stderr.flush()
                os._exit(2)
            send({"jsonrpc": "2.0", "id": req_id, "result": {
                "protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake", "version": "1"}}})
        elif method == "tools/list":
            tools = [] if "--no-tools" in ARGS else TOOLS
            cursor = (msg.get("params") or {}).get("cursor")
            if "--pages" in ARGS and cursor is None:
                send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": tools[:2], "nextCursor": "p2"}})
            elif "--pages" in ARGS:
                send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": tools[2:]}})
            else:
                send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": tools}})
        elif method == "tools/call":
            params = msg.get("params") or {}
            call(req_id, params.get("name"), params.get("arguments") or {})
        else:
            send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32601, "message": "no " + str(method)}})


if __name__ == "__main__":
    main()

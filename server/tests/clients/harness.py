"""What the client scripts share: the command line, a llama-hdd-server started on a free port
and stopped with SIGTERM, and named checks that stop the script at the first failure.

Standard library only; the scripts import it from their own directory.
"""

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request

# How long a server may take to answer /health after it starts, and to exit after SIGTERM.
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60


class CheckFailed(Exception):
    """A check's expectation did not hold."""


def expect(condition, message):
    """Fails the current check with `message` (any value; it is shown with repr) unless
    `condition` holds."""
    if not condition:
        raise CheckFailed(message if isinstance(message, str) else repr(message))


def parse_args(description):
    """The scripts' command line: the server binary, the model and a scratch directory."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("server", help="path of the llama-hdd-server binary")
    parser.add_argument("model", help="path of the GGUF model (SmolLM2-135M-Instruct)")
    parser.add_argument("scratch", help="a directory for the cache and the server logs")
    args = parser.parse_args()
    os.makedirs(args.scratch, exist_ok=True)
    return args


def free_port():
    """A TCP port nothing listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One llama-hdd-server process. `start` waits until /health answers 200; `stop` sends
    SIGTERM (requests finish, the prompt cache is flushed to disk) and requires a clean exit.
    As a context manager it makes sure the process is gone on exit: stopped with SIGTERM when
    the block ends normally, killed when it ends with an error."""

    def __init__(self, binary, model, scratch, name, extra=()):
        self.binary = binary
        self.model = model
        self.scratch = scratch
        self.name = name
        self.extra = list(extra)
        self.log_path = os.path.join(scratch, f"{name}.log")
        self.process = None
        self.port = None

    @property
    def url(self):
        """The server's root URL, e.g. `http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self.port}"

    def argv(self):
        """The launch line: the brief's settings, a cache directory of its own, the extras."""
        return [
            self.binary,
            "-m", self.model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--cache-dir", os.path.join(self.scratch, f"{self.name}-cache"),
            "-c", "4096",
            "-np", "2",
            "-t", "2",
            "--jinja",
            *self.extra,
        ]

    def start(self):
        """Starts the process and waits for /health. The port is picked on the first start and
        kept, so that clients reach the server again after a restart."""
        if self.port is None:
            self.port = free_port()
        log = open(self.log_path, "a", encoding="utf-8")
        log.write(f"\n$ {' '.join(self.argv())}\n")
        log.flush()
        self.process = subprocess.Popen(
            self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise CheckFailed(
                    f"the server ({self.name}) exited with {self.process.returncode} while "
                    f"starting\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.kill()
        raise CheckFailed(
            f"the server ({self.name}): /health did not answer in {START_TIMEOUT_S}s\n"
            + self.log_tail()
        )

    def stop(self):
        """SIGTERM, then waits for a clean exit (status 0)."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise CheckFailed(
                f"the server ({self.name}) did not exit within {STOP_TIMEOUT_S}s of SIGTERM"
            )
        if code != 0:
            raise CheckFailed(
                f"the server ({self.name}) exited with {code} after SIGTERM\n" + self.log_tail()
            )

    def kill(self):
        """Ends the process at once (cleanup after a failure)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self):
        """Stops the server with SIGTERM and starts it again on the same cache directory."""
        self.stop()
        return self.start()

    def log_tail(self, lines=30):
        """The end of the server's log, for failure messages."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError:
            return ""
        return f"--- last lines of {self.log_path} ---\n" + "".join(tail)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.stop()
        else:
            self.kill()
        return False


class Checks:
    """Named checks, run in order: `with checks("name"):` prints `ok   name (1.2s)` when its
    block succeeds, and on the first failure prints what failed (and where the servers' logs
    are) and exits with status 1."""

    def __init__(self, title, scratch):
        self.title = title
        self.scratch = scratch
        self.passed = 0
        self.t0 = time.monotonic()

    @contextlib.contextmanager
    def __call__(self, name):
        t = time.monotonic()
        try:
            yield
        except Exception as e:  # noqa: BLE001 - every failure is reported the same way
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            if not isinstance(e, CheckFailed):
                traceback.print_exc()
            print(f"{self.title}: the servers' logs are in {self.scratch}/*.log", flush=True)
            # Unwinds through the `with Server(...)` blocks, which kill their processes.
            raise SystemExit(1) from None
        self.passed += 1
        print(f"ok   {name} ({time.monotonic() - t:.1f}s)", flush=True)

    def done(self):
        """The summary line."""
        print(f"{self.title}: all {self.passed} checks passed in {time.monotonic() - self.t0:.0f}s")


def main_guard(run):
    """Runs `run()`, turning Ctrl-C into a clean exit status."""
    try:
        run()
    except KeyboardInterrupt:
        sys.exit(130)

"""Drives the server's web page (`/`) in a real browser: headless Chromium through Selenium.

It starts the server on the real model with a cache directory of its own, opens the page, sends
a message and sees the reply stream in, restarts the server on the same cache directory,
reloads the page, finds the conversation in the list, continues it, and checks that the reply's
`cache_n` shows the earlier conversation came from the cache. Then a server with an API key:
the page asks for the key, keeps it and lists with it. Screenshots go to the directory in
`$WEBUI_SCREENSHOTS` (default `target/webui-screenshots`).

    apt-get install chromium chromium-driver   # /usr/bin/chromium, /usr/bin/chromedriver
    pip install -r server/tests/clients/requirements.txt
    python3 server/tests/clients/webui_browser.py \\
        target/debug/llama-hdd-server models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/scratch

`cargo xtask clients` runs this script with the others; CI runs them.
"""

import os
import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
from harness import CheckFailed, Checks, Server, expect, main_guard, parse_args  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
# How long the page may take to show what a check waits for.
WAIT_S = 60
# Tokens a reply may take: enough to stream over many frames, few enough to be quick.
MAX_TOKENS = 48

# Counts the reply's repaints while it streams (the reply's body changes while `aria-busy`
# says it is still coming): a reply that only appears whole counts none.
WATCH_STREAM = """
window.__streamed = 0;
const log = document.getElementById('messages');
new MutationObserver(() => {
  const bodies = log.querySelectorAll('.message.assistant .body');
  const last = bodies[bodies.length - 1];
  if (last && last.getAttribute('aria-busy') === 'true' && last.textContent.length > 0) {
    window.__streamed += 1;
  }
}).observe(log, { subtree: true, childList: true, characterData: true });
"""


def browser(scratch):
    """Headless Chromium with a fresh profile, nothing reaching the network but the server."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-", dir=scratch)
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1000,700",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_window_size(1000, 700)
    return driver


def wait(driver, what, condition):
    """Waits until `condition(driver)` is truthy; fails naming `what`."""
    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(lambda d: condition(d))
    except Exception as e:  # noqa: BLE001 - a timeout or a stale element alike
        raise CheckFailed(f"the page never showed {what} ({type(e).__name__})") from None


def find(driver, css):
    return driver.find_elements(By.CSS_SELECTOR, css)


def send(driver, text):
    """Types `text` into the message box and presses Enter; waits for the reply's figures,
    which the page adds when the stream ends. Returns the reply's message element."""
    before = len(find(driver, ".message.assistant .stats"))
    driver.execute_script(WATCH_STREAM)
    box = driver.find_element(By.ID, "prompt")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)
    wait(driver, "the reply's end", lambda d: len(find(d, ".message.assistant .stats")) > before)
    reply = find(driver, ".message.assistant")[-1]
    stats = reply.find_element(By.CSS_SELECTOR, ".stats")
    expect("error" not in stats.get_attribute("class"), f"the reply failed: {stats.text}")
    expect(reply.find_element(By.CSS_SELECTOR, ".body").text.strip(), "the reply is empty")
    expect(
        driver.execute_script("return window.__streamed") > 0,
        "the reply was never shown before it ended (not streamed)",
    )
    expect(not driver.find_element(By.ID, "send").get_attribute("hidden"), "Send is back")
    return reply


def settings(driver, max_tokens=None):
    """A short reply at temperature 0: the settings of the page, set as a user would (opened,
    filled, closed again)."""
    summary = driver.find_element(By.CSS_SELECTOR, ".settings summary")
    summary.click()
    for field, value in (("max-tokens", max_tokens or MAX_TOKENS), ("temperature", 0)):
        el = driver.find_element(By.ID, field)
        el.clear()
        el.send_keys(str(value))
    summary.click()


def run():
    args = parse_args("llama-hdd-server's web page in headless Chromium")
    shots = os.environ.get("WEBUI_SCREENSHOTS", os.path.join("target", "webui-screenshots"))
    os.makedirs(shots, exist_ok=True)
    checks = Checks("webui_browser", args.scratch)
    shot = lambda d, name: d.save_screenshot(os.path.join(shots, name))  # noqa: E731

    with Server(args.server, args.model, args.scratch, "webui") as srv:
        srv.start()
        driver = browser(args.scratch)
        try:
            with checks("the page loads, with no list and the cache panel"):
                driver.get(srv.url + "/")
                wait(driver, "the message box", lambda d: d.find_element(By.ID, "prompt"))
                wait(driver, "the empty list", lambda d: "No conversation" in d.find_element(By.ID, "list-status").text)
                wait(driver, "the cache figures", lambda d: "On disk" in d.find_element(By.ID, "cache-figures").text)
                expect(not driver.find_element(By.ID, "model-pick").is_displayed(), "one model: no picker")
                expect(not driver.find_element(By.ID, "stop").is_displayed(), "no Stop before a reply")
                settings(driver)

            with checks("a message gets a streamed reply, listed by the server"):
                send(driver, "Name three things a hard disk is good for.")
                wait(driver, "the conversation in the list", lambda d: len(find(d, ".conversation")) == 1)
                meta = find(driver, ".conversation .meta")[0].text
                expect("tokens" in meta and ("KiB" in meta or "MiB" in meta), f"the list's figures: {meta!r}")
                shot(driver, "01-first-reply.png")

            with checks("after a restart of the server and a reload, the conversation is listed"):
                srv.restart()
                driver.refresh()
                wait(driver, "the conversation in the list", lambda d: len(find(d, ".conversation .open")) == 1)
                title = find(driver, ".conversation .title")[0].text
                expect(title.startswith("Name three things"), f"its title: {title!r}")
                shot(driver, "02-after-restart.png")

            with checks("continuing it starts from the cache (cache_n)"):
                settings(driver)
                find(driver, ".conversation .open")[0].click()
                wait(driver, "its two messages", lambda d: len(find(d, ".message")) == 2)
                info = driver.find_element(By.ID, "chat-info").text
                expect("tokens" in info, f"the conversation's figures: {info!r}")
                # The conversation's tokens, all but its last sampled one (never evaluated)
                # come back from the cache directory.
                tokens = int(info.split(" tokens")[0].replace(",", ""))
                reply = send(driver, "Which one matters most?")
                stats = reply.find_element(By.CSS_SELECTOR, ".stats")
                cache_n = int(stats.get_attribute("data-cache-n"))
                expect(
                    cache_n >= tokens - 1,
                    f"the earlier turn ({tokens} tokens) came from the cache: cache_n {cache_n} ({stats.text})",
                )
                expect("from the cache" in stats.text, stats.text)
                wait(driver, "one conversation, continued", lambda d: len(find(d, ".conversation")) == 1 and "2 turns" in find(d, ".conversation .meta")[0].text)
                wait(driver, "a chart of the hit rate", lambda d: find(d, "#chart polyline"))
                shot(driver, "03-continued.png")
                driver.set_window_size(390, 844)
                shot(driver, "04-phone.png")
                driver.set_window_size(1000, 700)
        finally:
            driver.quit()

    with Server(args.server, args.model, args.scratch, "webui-key", extra=["--api-key", "s3cret"]) as srv:
        srv.start()
        driver = browser(args.scratch)
        try:
            with checks("with --api-key the page asks for the key, keeps it and uses it"):
                driver.get(srv.url + "/")
                wait(driver, "the key dialog", lambda d: d.find_element(By.ID, "key-dialog").get_attribute("open") is not None)
                shot(driver, "05-api-key.png")
                driver.find_element(By.ID, "key-input").send_keys("s3cret")
                driver.find_element(By.ID, "key-save").click()
                wait(driver, "the list read with the key", lambda d: "No conversation" in d.find_element(By.ID, "list-status").text)
                expect(driver.find_element(By.ID, "key-dialog").get_attribute("open") is None, "the dialog closed")
                driver.refresh()
                wait(driver, "the list read with the kept key", lambda d: "No conversation" in d.find_element(By.ID, "list-status").text)
                expect(driver.find_element(By.ID, "key-dialog").get_attribute("open") is None, "no question after a reload")

            with checks("Stop ends a streaming reply"):
                settings(driver, max_tokens=2000)
                box = driver.find_element(By.ID, "prompt")
                box.send_keys("Write a very long story about a librarian and a tape drive.")
                box.send_keys(Keys.ENTER)
                wait(driver, "the reply streaming", lambda d: d.find_element(By.ID, "stop").is_displayed() and find(d, ".message.assistant .body")[-1].text.strip())
                driver.find_element(By.ID, "stop").click()
                wait(driver, "the reply stopped", lambda d: [e.text for e in find(d, ".message.assistant .stats")] == ["Stopped."])
                expect(driver.find_element(By.ID, "send").is_displayed(), "Send is back")
        finally:
            driver.quit()
    checks.done()


if __name__ == "__main__":
    main_guard(run)

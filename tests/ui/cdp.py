"""A minimal headless-Chromium driver over the Chrome DevTools Protocol.

Why not selenium/playwright: both add packages (and playwright its own browser build, which cannot be
downloaded here); Debian's chromium speaks CDP itself and `websockets` is already installed with
dagster-webserver (uvicorn[standard]). This is all the UI test needs: open a URL, wait until the
page's text contains what we expect (the Dagster UI renders with JS after GraphQL calls), read the
DOM text, take a screenshot, close."""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1600,1000", "--hide-scrollbars"]


def find_chromium() -> str | None:
    for cand in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and os.path.exists(cand):
            return cand
    return None


class Browser:
    """One headless chromium process (own session, fresh profile) and one page."""

    def __init__(self, binary: str, profile_dir: Path, timeout_s: float = 60):
        self.ws = None
        self.profile_dir = Path(profile_dir)
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        (self.profile_dir / "DevToolsActivePort").unlink(missing_ok=True)  # a stale one names a dead port
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile_dir}", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._attach(timeout_s)
        except BaseException:
            self.close()  # never leave a browser behind
            raise

    def _attach(self, timeout_s: float) -> None:
        port_file = self.profile_dir / "DevToolsActivePort"
        t0 = time.time()
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.proc.returncode} before opening its debugging port")
            if time.time() - t0 > timeout_s:
                raise TimeoutError("chromium did not open its debugging port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        targets = json.loads(opener.open(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        self._id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, timeout_s: float = 60, **params) -> dict:
        self._id += 1
        mid = self._id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.time() + timeout_s
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.time())))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"CDP {method} failed: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res.get("result", {}).get("value")

    def text(self) -> str:
        """The rendered text of the page (what a person reads)."""
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def html(self) -> str:
        return self.evaluate("document.documentElement ? document.documentElement.outerHTML : ''") or ""

    def click_text(self, label: str, selector: str = "button, a, [role=tab], span") -> bool:
        """Click (real mouse events at its centre) the last-rendered visible element whose text is label."""
        js = ("(() => { const els = [...document.querySelectorAll(%s)].filter(e => e.innerText && e.innerText.trim() === %s"
              " && e.getBoundingClientRect().width > 0); if (!els.length) return null; const e = els[els.length - 1];"
              " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
              " return [r.left + r.width / 2, r.top + r.height / 2]; })()") % (json.dumps(selector), json.dumps(label))
        at = self.evaluate(js)
        if not at:
            return False
        x, y = at
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
        return True

    def wait_for_text(self, needles: list[str], timeout_s: float = 90, poll_s: float = 0.5) -> str:
        """Wait until every needle is in the page text; returns the text (raises with what is missing)."""
        deadline = time.time() + timeout_s
        text = ""
        while time.time() < deadline:
            text = self.text()
            if all(n in text for n in needles):
                return text
            time.sleep(poll_s)
        missing = [n for n in needles if n not in text]
        raise AssertionError(f"page never showed {missing} within {timeout_s} s; its text was:\n{text[:3000]}")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params = {"format": "png"}
        if full_page:
            metrics = self.call("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics.get("contentSize")
            w, h = int(min(size["width"], 2400)), int(min(size["height"], 4000))
            params.update(clip={"x": 0, "y": 0, "width": max(w, 1), "height": max(h, 1), "scale": 1},
                          captureBeyondViewport=True)
        data = self.call("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            if self.ws is not None:
                self.ws.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        try:  # renderer / zygote processes that outlived the browser
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

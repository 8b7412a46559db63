"""Drive real headless Chromium over the DevTools protocol on a pipe (no websocket library).

``--remote-debugging-pipe`` makes Chromium read commands from fd 3 and write replies and events
to fd 4, each a JSON object ended by a NUL byte. Used by the report tests to open the HTML report
and record console errors, exceptions, network requests and dialogs while it renders.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set

if TYPE_CHECKING:
    import psutil

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


LIVE_BROWSERS: Set[int] = set()
"""The pids of the browsers open now (the session's shared one lives as long as the session):
a test that asserts it left no child process leaves these trees out (``children_left``)."""


class ChromiumError(RuntimeError):
    pass


def children_left() -> List[psutil.Process]:
    """This process's descendants, less the open browsers and theirs."""
    import psutil

    browsers = {pid for pid in LIVE_BROWSERS if psutil.pid_exists(pid)}
    trees = {
        child.pid
        for pid in browsers
        for child in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    }
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in trees]


class Chromium:
    """One headless browser; :meth:`open` loads a page in a fresh tab and reports on it."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        if CHROMIUM is None:
            raise ChromiumError("chromium is not installed")
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="torchscale-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipes() -> None:  # runs in the child between fork and exec
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-extensions",
                "--disable-sync",
                "--mute-audio",
                "--hide-scrollbars",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=wire_pipes,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        LIVE_BROWSERS.add(self.process.pid)
        self._buffer = b""
        self._next_id = 0
        self.events: List[Dict[str, Any]] = []

    def close(self) -> None:
        with contextlib.suppress(ChromiumError, OSError):
            self.send("Browser.close")
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        LIVE_BROWSERS.discard(self.process.pid)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read_message(self, deadline: float) -> Dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise ChromiumError("timed out waiting for chromium")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise ChromiumError("chromium closed the pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(
        self, method: str, params: Optional[Dict[str, Any]] = None, session: Optional[str] = None
    ) -> Dict[str, Any]:
        self._next_id += 1
        command: Dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            command["sessionId"] = session
        os.write(self._to_browser, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self._read_message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise ChromiumError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, session: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not any(
            e.get("method") == method and e.get("sessionId") == session for e in self.events
        ):
            self.events.append(self._read_message(deadline))

    def open(self, path: Path, ready_js: str, width: int = 1280) -> Page:
        """Load ``path``, wait until ``ready_js`` evaluates true, return the page's record."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(f"{domain}.enable", session=session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        url = path.resolve().as_uri()
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session)
        page = Page(self, session, url)
        deadline = time.monotonic() + self.timeout_s
        while not page.evaluate(ready_js):
            if time.monotonic() > deadline:
                raise ChromiumError(f"page never became ready: {ready_js}")
            time.sleep(0.1)
        return page


class Page:
    def __init__(self, browser: Chromium, session: str, url: str) -> None:
        self.browser, self.session, self.url = browser, session, url

    def evaluate(self, expression: str) -> Any:
        result = self.browser.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True},
            session=self.session,
        )
        if "exceptionDetails" in result:
            raise ChromiumError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def _events(self, method: str) -> List[Dict[str, Any]]:
        return [
            e["params"]
            for e in self.browser.events
            if e.get("method") == method and e.get("sessionId") == self.session
        ]

    @property
    def console_errors(self) -> List[str]:
        errors = [
            " ".join(str(a.get("value", a.get("description", ""))) for a in e["args"])
            for e in self._events("Runtime.consoleAPICalled")
            if e["type"] in ("error", "assert")
        ]
        errors += [
            e["exceptionDetails"].get("text", "")
            + " "
            + str(e["exceptionDetails"].get("exception", {}).get("description", ""))
            for e in self._events("Runtime.exceptionThrown")
        ]
        errors += [
            e["entry"]["text"]
            for e in self._events("Log.entryAdded")
            if e["entry"]["level"] == "error"
        ]
        return errors

    @property
    def requests(self) -> List[str]:
        """Every URL the page asked for, its own document included."""
        return [e["request"]["url"] for e in self._events("Network.requestWillBeSent")]

    @property
    def dialogs(self) -> List[str]:
        return [e.get("message", "") for e in self._events("Page.javascriptDialogOpening")]

    def screenshot(self, path: Path) -> None:
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": min(height, 16000), "deviceScaleFactor": 1, "mobile": False},
            session=self.session,
        )
        shot = self.browser.send("Page.captureScreenshot", {"format": "png"}, session=self.session)
        path.write_bytes(base64.b64decode(shot["data"]))

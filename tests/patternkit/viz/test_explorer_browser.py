"""pk.explore in a real browser: headless Chromium opened on Model Explorer's local server.

Chromium is driven over its DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages separated by NUL bytes on file descriptors 3 and 4), so the test needs no
client library; it waits until Model Explorer has laid the graphs out, searches the
groups with Model Explorer's own search box, and takes a screenshot.  It is skipped,
with the reason, only when Chromium or the ``[explorer]`` extra is absent.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from explorer_cases import COMPILER, conv_layers

import patternkit as pk
from patternkit.app.rules import resolve_rules
from patternkit.byoc import CompositeLog, merge_composite, partition_graph
from patternkit.byoc.reports.offload import explain_offload
from patternkit.byoc.tables import PatternTable
from patternkit.viz.explorer import explore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium (Debian's chromium) is "
                                                "not installed"),
    pytest.mark.skipif(not __import__("importlib").util.find_spec("model_explorer"),
                       reason="the [explorer] extra (ai-edge-model-explorer) is absent"),
]

#: Model Explorer lays out in a web worker; on two shared CPUs this takes a few seconds.
LAYOUT_SECONDS = 90


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe; stop with close()."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 900):
        to_browser, self._writer = os.pipe()
        self._reader, from_browser = os.pipe()

        def as_fds_3_and_4() -> None:  # the pipe protocol's fixed descriptors
            read, write = os.dup(to_browser), os.dup(from_browser)
            os.dup2(read, 3)
            os.dup2(write, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.process = subprocess.Popen(  # noqa: S603 - the system's chromium
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--use-angle=swiftshader",
             "--enable-unsafe-swiftshader", f"--window-size={width},{height}",
             "--remote-debugging-pipe", "--no-first-run", f"--user-data-dir={profile}",
             "about:blank"],
            close_fds=False, preexec_fn=as_fds_3_and_4, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._id = 0
        self.session = ""

    def call(self, method: str, **params: Any) -> dict:
        """Send one command (to the page, once :meth:`open` attached) and wait for its reply."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._writer, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._reader, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe during {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> None:
        """A new tab on ``url``."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                          awaitPromise=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression[:60]}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def text(self) -> str:
        return str(self.evaluate("document.body.innerText") or "")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

    def close(self) -> None:
        """Close the browser and wait for its process (killed, by id, if it lingers)."""
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        os.close(self._writer)
        os.close(self._reader)


def _search(browser: Chromium, pane: int, regex: str) -> None:
    """Type ``regex`` into Model Explorer's "Search nodes/layers" box of ``pane``."""
    found = browser.evaluate(f"""(() => {{
        const boxes = document.querySelectorAll('input[placeholder*="Search nodes"]');
        const box = boxes[{pane}];
        if (!box) return boxes.length;
        box.focus();
        box.value = {json.dumps(regex)};
        box.dispatchEvent(new Event('input', {{bubbles: true}}));
        box.dispatchEvent(new KeyboardEvent('keyup', {{key: 'Enter', bubbles: true}}));
        return -1;
    }})()""")
    assert found == -1, f"pane {pane}'s search box not found ({found} box(es) on the page)"


def _pixels(browser: Chromium, png: bytes) -> dict:
    """Colour statistics of a PNG, decoded by the browser's own image decoder."""
    data = base64.b64encode(png).decode()
    return browser.evaluate(f"""(async () => {{
        const img = new Image();
        img.src = 'data:image/png;base64,{data}';
        await img.decode();
        const canvas = document.createElement('canvas');
        canvas.width = img.width; canvas.height = img.height;
        const ctx = canvas.getContext('2d');
        ctx.drawImage(img, 0, 0);
        const px = ctx.getImageData(0, 0, img.width, img.height).data;
        const colours = new Set();
        let notWhite = 0;
        for (let i = 0; i < px.length; i += 4) {{
            colours.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
            if (px[i] < 240 || px[i + 1] < 240 || px[i + 2] < 240) notWhite++;
        }}
        return {{width: img.width, height: img.height, colours: colours.size,
                 notWhite: notWhite / (px.length / 4)}};
    }})()""")


def test_model_explorer_shows_both_graphs_their_groups_and_overlays(tmp_path):
    before = conv_layers(3, stem=True)
    chosen = resolve_rules(None)
    log = pk.RewriteLog()
    rewritten = pk.rewrite(chosen.rewrite_rules(), before, log=log)
    table = PatternTable(chosen.composites().for_compiler(COMPILER), COMPILER)
    merge_log = CompositeLog()
    merged = merge_composite(rewritten, table, log=merge_log)
    after = partition_graph(merged, COMPILER)
    ex = explore(before, after, log=log, offload=explain_offload(merged, merge_log, table))

    browser = Chromium(tmp_path / "profile")
    try:
        with ex.serve() as server:
            browser.open(server.url)
            # the graphs are laid out, then each pane loads its overlays
            expected = ["before | before", "after | after", "rewrites", "offload",
                        "replaced by conv.fold_batchnorm", "host: uncovered"]
            deadline = time.monotonic() + LAYOUT_SECONDS
            text = ""
            while time.monotonic() < deadline:
                time.sleep(1)
                text = browser.text()
                if text.count("GRAPH INFO") == 2 and "Processing" not in text and \
                        all(e in text for e in expected):
                    break
            assert text.count("GRAPH INFO") == 2, f"the graphs were not laid out in " \
                                                  f"{LAYOUT_SECONDS} s: {text[:300]!r}"
            for item in expected:  # both panes, with their graphs and their overlays
                assert item in text, f"{item!r} not on the page"
            # the groups, found by Model Explorer's own search
            _search(browser, 0, "layer")
            _search(browser, 1, "conv2d_add_relu")
            time.sleep(3)
            text = browser.text()
            for group in ("layer1", "layer2", "layer3", "ccompiler.conv2d_add_relu",
                          "ccompiler.conv2d_add_relu#2", "ccompiler.conv2d_add_relu#3"):
                assert group in text, f"{group} not found by the search"
            png = browser.screenshot()
            (tmp_path / "explorer.png").write_bytes(png)
            stats = _pixels(browser, png)
        assert not server.running
    finally:
        browser.close()
    assert browser.process.returncode is not None
    assert stats["width"] == 1400 and stats["height"] > 600  # the window less its frame
    # a page of graphs, panels and coloured overlays, not a blank or a one-colour page
    assert stats["colours"] > 50 and stats["notWhite"] > 0.05

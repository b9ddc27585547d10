"""report.html: every run writes it beside report.md, one file that opens offline in a
browser with every section, the drawings folded, and every text from the model escaped.
The browser checks run Debian's headless ``chromium`` and are skipped without it.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from patternkit.app.job import run
from patternkit.app.near_misses import NearMissSection
from patternkit.app.report import (
    JobReport,
    NumericResult,
    OffloadSection,
    RoundTripEntry,
    SiteValidation,
)
from patternkit.app.report_html import SECTIONS, report_html, write_report_html
from patternkit.app.summary import OpSummary
from patternkit.app.svg_inline import SvgError, inline_svg
from patternkit.engine.near_misses import NearMiss
from patternkit.verification.sites import Site, SiteReport

HOSTILE = '<script>alert("x")</script>'
CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not "
                                    "installed (.ci/run installs it): no browser to open "
                                    "report.html in")


def _report(**changes) -> JobReport:
    site = Site("batchnorm.collapse", "main", "lv4", "fail", "max abs error 1 > 1e-4",
                max_abs_error=1.0, tolerance="rtol 1e-4", duplicates=["lv9"])
    fields = dict(
        model=f"model {HOSTILE}.py", compiler="ccompiler", rewrites={"batchnorm.collapse": 2},
        offload=OffloadSection({"ccompiler.conv2d_add_relu": 3}, 9,
                               ["main:lv1 = relax.reshape: uncovered: no pattern table entry "
                                f"covers relax.reshape {HOSTILE}"]),
        ops=[OpSummary("reshape", 1, {"host": 1})],
        numeric=NumericResult(ok=True, status="pass", max_abs_error=2e-7, rtol=1e-4,
                              atol=1e-4, seed=0),
        sites=SiteValidation(SiteReport([site], builds=1)),
        roundtrip={"FuseOps": RoundTripEntry(True)},
        drawings={"before": "not drawn: 9000 nodes is past the layout limit"},
        seconds={"load": 1.5, "rewrite": 0.25},
        near_misses=NearMissSection([NearMiss("softmax", "exp / sum(exp)", "main", "lv7",
                                              "softmax.collapse", f"axis {HOSTILE}",
                                              "check")], families=["softmax"]))
    fields.update(changes)
    return JobReport(**fields)


def test_every_text_from_the_model_is_escaped():
    page = report_html(_report())
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # the page's own


def test_the_page_has_every_section_the_verdict_first_and_fetches_nothing():
    page = report_html(_report(training={"ok": True, "max_rel_error": 1e-5}))
    found = re.findall(r'<section id="([a-z-]+)"', page)
    assert found == list(SECTIONS)
    assert 'class="badge fail"' in page  # the failed site fails the run
    assert re.search(r'(?:src|href)="(?!#)', page) is None


def test_the_training_section_is_left_out_when_the_job_did_not_differentiate():
    found = re.findall(r'<section id="([a-z-]+)"', report_html(_report()))
    assert "training" not in found and len(found) == len(SECTIONS) - 1


def test_the_near_misses_are_listed_with_the_rules_reason_or_why_none_were_looked_for():
    page = report_html(_report())
    assert "main:lv7" in page and "axis &lt;script&gt;" in page
    page = report_html(_report(near_misses=NearMissSection(not_run="no family detector")))
    assert "NOT RUN: no family detector" in page


def test_each_rules_sites_are_listed_with_their_verdicts():
    page = report_html(_report())
    assert "batchnorm.collapse: 1 site(s) and 1 identical to one of them" in page
    assert "main:lv4" in page and "max abs error 1 &gt; 1e-4" in page


def test_a_drawing_is_inlined_folded_and_a_missing_one_says_so(tmp_path):
    (tmp_path / "after.svg").write_text(_SVG)
    report = _report(drawings={"after": "as is (0.1 s)", "before": "not drawn: too big"})
    page = report_html(report, tmp_path)
    drawings = page[page.index('<section id="drawings"'):]
    assert '<details class="drawing-box"><summary>after.svg: as is (0.1 s)' in drawings
    assert '<details class="drawing-box" open' not in drawings
    assert 'id="after-node1"' in drawings and "no drawing" in drawings


_SVG = """<?xml version="1.0" encoding="UTF-8" standalone="no"?>
<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN"
 "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">
<svg width="80pt" height="40pt" xmlns="http://www.w3.org/2000/svg"
     xmlns:xlink="http://www.w3.org/1999/xlink" onload="alert(1)">
<defs><linearGradient id="g1"><stop offset="0" stop-color="red"/></linearGradient></defs>
<script>alert(2)</script>
<g id="node1" class="node"><a xlink:href="https://example.com/x" xlink:title="lv1">
<ellipse fill="url(#g1)" stroke="black" cx="40" cy="20" rx="30" ry="15"/>
<text x="40" y="24">&lt;lv1&gt;</text></a>
<use xlink:href="#node1"/><image href="https://example.com/y.png"/>
<rect style="fill: url(https://example.com/z)"/></g>
</svg>
"""


def test_an_inlined_svg_runs_nothing_loads_nothing_and_keeps_its_ids_apart():
    svg = inline_svg(_SVG, "before-")
    assert svg.startswith("<svg") and "<?xml" not in svg and "DOCTYPE" not in svg
    assert "alert" not in svg and "example.com" not in svg
    assert 'id="before-node1"' in svg and 'fill="url(#before-g1)"' in svg
    assert 'xlink:href="#before-node1"' in svg
    assert "&lt;lv1&gt;" in svg and 'xlink:title="lv1"' in svg


@pytest.mark.parametrize("text, why", [("not xml at all <", "not an SVG drawing: "),
                                       ("<html><body/></html>", "the root element is <html>")])
def test_a_file_that_is_not_svg_is_refused_with_the_reason(text, why):
    with pytest.raises(SvgError, match=re.escape(why)):
        inline_svg(text, "x-")


# -- a real run, opened in a real browser ----------------------------------------------------------
@pytest.fixture(scope="module")
def job_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("job") / "out"
    run("seed-batchnorm", out_dir=out)
    return out


def test_every_run_writes_report_html_beside_report_md(job_folder):
    import json

    assert (job_folder / "report.html").is_file() and (job_folder / "report.md").is_file()
    saved = json.loads((job_folder / "report.json").read_text())
    assert "report.html" in saved["outputs"]
    page = (job_folder / "report.html").read_text()
    for name in ("before", "after", "diff"):
        assert f'<summary>{name}.svg: ' in page and f'id="{name}-graph0"' in page


def _chromium(*argv: str, page: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    """Headless chromium on ``page``, offline (every proxy made unreachable)."""
    command = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox",
               "--no-first-run", "--proxy-server=127.0.0.1:9", "--enable-logging=stderr",
               "--v=0", *argv, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def _console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines()
            if "CONSOLE" in line or "Uncaught" in line or "Refused to" in line]


@needs_chromium
def test_report_html_opens_offline_with_every_section_and_no_console_error(job_folder):
    done = _chromium("--dump-dom", page=job_folder / "report.html")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console_errors(done.stderr) == []
    found = re.findall(r'<section id="([a-z-]+)"', done.stdout)
    assert found == [s for s in SECTIONS if s != "training"]
    assert done.stdout.count('<details class="drawing-box">') == 3


@needs_chromium
def test_the_console_check_sees_a_script_error(tmp_path):
    # the check above could pass by reading the wrong log: a page that throws must show
    broken = tmp_path / "broken.html"
    broken.write_text("<!DOCTYPE html><p>x</p><script>undefinedFunction();</script>")
    done = _chromium("--dump-dom", page=broken)
    assert any("undefinedFunction" in line for line in _console_errors(done.stderr))


@needs_chromium
def test_the_screenshot_of_report_html_is_not_blank(job_folder, tmp_path):
    shot = tmp_path / "shot.png"
    done = _chromium(f"--screenshot={shot}", "--window-size=480,360",
                     page=job_folder / "report.html")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    pixels = _png_pixels(shot.read_bytes())
    assert len(set(pixels)) > 8  # white page, text, the green verdict badge


def _png_pixels(data: bytes) -> list[tuple[int, ...]]:
    """The pixels of an 8-bit RGB/RGBA PNG (what chromium writes), without an image library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks, header = 8, [], b""
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    step = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(b"".join(chunks)), width * step
    rows: list[bytearray] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - step] if i >= step else 0
            up, corner = previous[i], previous[i - step] if i >= step else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc
                                      else corner)) & 255
        rows.append(line)
        previous = line
    return [tuple(row[x:x + step]) for row in rows for x in range(0, stride, step)]


def test_write_report_html_writes_the_page_into_the_folder(tmp_path):
    path = write_report_html(tmp_path, _report())
    assert path == tmp_path / "report.html"
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")

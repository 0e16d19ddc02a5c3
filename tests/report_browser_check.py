#!/usr/bin/env python3
"""Browser check of `moesim report`: generate a report, open it in headless Chromium, and check
that the page loads without console errors or network requests, that every chart's <svg> is in
the rendered DOM with shapes in it and parses as XML, and that a screenshot is non-trivial —
of the whole page and of every section on its own (section-<id>.png in the work directory, to
be looked at: each must have ink on it).

    report_browser_check.py --cli build/bin/moesim --scenario scenarios/pangu-ultra-moe-718b.json \
        --workdir build/tests/report_browser [-- extra report options]

Exit status: 0 pass, 1 fail, 77 skipped (no Chromium: CI installs the Debian `chromium`
package through tools/setup.sh).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

SKIP = 77
# Charts every report of a MoE scenario with balanced routing and a scaling sweep has
# (tools/cli/html_report.cpp, report_chart_ids; the expert-load map only under skewed routing).
CHART_IDS = ["chart-breakdown", "chart-critical-path", "chart-timeline", "chart-schedule", "chart-memory",
             "chart-scaling", "chart-goodput"]
SHAPES = re.compile(r"<(rect|circle|polyline|line|path)\b")
# Chromium's --enable-logging=stderr prints every page console message, whatever its level
# (console.error included), as
#   [pid:tid:date:INFO:CONSOLE:line] "message", source: file:///... (line)
# (older versions: CONSOLE(line)), and uncaught exceptions as "Uncaught ...". The report has no
# script, so any console line is an error. Failed loads (a request from a page that should be
# self-contained) show as net::ERR_ or "Failed to load resource".
CONSOLE_ERROR = re.compile(r"(:CONSOLE[:(]|Uncaught|Failed to load resource|net::ERR_)")


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(browser, profile, *args, timeout=90):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # a sanitizer build's runtimes are not Chromium's
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def png_ink(path):
    """Share of a PNG's decompressed scanline bytes that are neither white (255) nor zero: a
    blank page has almost none. Pure Python (zlib), no imaging library."""
    import struct
    import zlib
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return -1.0
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    ink = sum(1 for b in raw[::7] if b not in (0, 255))
    return ink / max(1, len(raw[::7]))


def section_pages(source, workdir):
    """One page per <section id=...> of the report: its <head> (styles) and that section."""
    head = source[:source.index("<body>")]
    pages = []
    for m in re.finditer(r'<section id="([^"]+)">.*?</section>', source, re.S):
        page = os.path.join(workdir, f"section-{m.group(1)}.html")
        with open(page, "w", encoding="utf-8") as f:
            f.write(head + "<body>\n" + m.group(0) + "\n</body>\n</html>\n")
        pages.append((m.group(1), page))
    return pages


def fail(msg):
    print(f"FAIL: {msg}")
    return 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("extra", nargs="*", help="options passed to moesim report")
    a = ap.parse_args()

    browser = find_chromium()
    if browser is None:
        print("SKIP: no chromium on PATH (tools/setup.sh installs it; CI has it)")
        return SKIP

    os.makedirs(a.workdir, exist_ok=True)
    html = os.path.abspath(os.path.join(a.workdir, "report.html"))
    png = os.path.abspath(os.path.join(a.workdir, "report.png"))
    for f in (html, png):
        if os.path.exists(f):
            os.remove(f)

    t0 = time.monotonic()
    gen = subprocess.run([a.cli, "report", a.scenario, "--out", html, *a.extra], capture_output=True, text=True,
                         timeout=600)
    print(f"moesim report: exit {gen.returncode} in {time.monotonic() - t0:.1f} s: {gen.stdout.strip()}")
    if gen.returncode != 0:
        return fail(f"moesim report exited {gen.returncode}:\n{gen.stderr}")
    source = open(html, encoding="utf-8").read()
    size = len(source.encode("utf-8"))
    print(f"report: {size / 1024:.0f} KB")
    if size > 5 * 1024 * 1024:
        return fail(f"report is {size / 1e6:.1f} MB; the timeline should be aggregated to stay below 5 MB")
    for bad in ("<script", "<link rel=\"stylesheet\"", "@import", "url(http", "src=\"http", "href=\"http"):
        if bad in source:
            return fail(f"the report is not self-contained: it contains {bad!r}")

    with tempfile.TemporaryDirectory(prefix="moesim-chromium-") as profile:
        url = "file://" + html
        dom = chromium(browser, profile, "--dump-dom", url)
        if dom.returncode != 0:
            return fail(f"chromium --dump-dom exited {dom.returncode}:\n{dom.stderr[-2000:]}")
        errors = [l for l in dom.stderr.splitlines() if CONSOLE_ERROR.search(l)]
        shot = chromium(browser, profile, f"--screenshot={png}", "--window-size=1280,4000", url)
        errors += [l for l in shot.stderr.splitlines() if CONSOLE_ERROR.search(l)]
        section_shots = []
        for sid, page in section_pages(source, a.workdir):
            spng = os.path.abspath(os.path.join(a.workdir, f"section-{sid}.png"))
            if os.path.exists(spng):
                os.remove(spng)
            r = chromium(browser, profile, f"--screenshot={spng}", "--window-size=1280,1400", "file://" + os.path.abspath(page))
            errors += [l for l in r.stderr.splitlines() if CONSOLE_ERROR.search(l)]
            section_shots.append((sid, spng))
    if errors:
        return fail("console errors while loading the page:\n" + "\n".join(errors))

    text = dom.stdout
    if "<h1>" not in text or "</html>" not in text:
        return fail("the dumped DOM is not the report:\n" + text[:500])
    for chart in CHART_IDS:
        m = re.search(r'<svg id="%s"[^>]*>(.*?)</svg>' % re.escape(chart), text, re.S)
        if m is None:
            return fail(f'no <svg id="{chart}"> in the rendered page')
        shapes = len(SHAPES.findall(m.group(1)))
        if shapes == 0:
            return fail(f"chart {chart} has no shapes")
        # Each chart as served must be well-formed XML on its own (escaping, closed tags).
        m_src = re.search(r'<svg id="%s".*?</svg>' % re.escape(chart), source, re.S)
        try:
            ET.fromstring(m_src.group(0))
        except ET.ParseError as e:
            return fail(f"chart {chart} is not well-formed SVG: {e}")
        print(f"chart {chart}: {shapes} shapes")

    if not os.path.exists(png):
        return fail("chromium wrote no screenshot:\n" + shot.stderr[-2000:])
    png_size = os.path.getsize(png)
    print(f"screenshot {png}: {png_size / 1024:.0f} KB")
    if png_size < 50 * 1024:
        return fail(f"the screenshot is only {png_size} bytes: the page looks empty")
    with open(png, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            return fail("the screenshot is not a PNG")
    if len(section_shots) < 6:
        return fail(f"only {len(section_shots)} sections found in the report")
    for sid, spng in section_shots:
        if not os.path.exists(spng):
            return fail(f"chromium wrote no screenshot of section {sid}")
        ink = png_ink(spng)
        print(f"section {sid}: {spng} ({os.path.getsize(spng) / 1024:.0f} KB, ink {100 * ink:.1f}%)")
        if ink < 0.002:
            return fail(f"the screenshot of section {sid} is blank (ink {100 * ink:.2f}%)")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

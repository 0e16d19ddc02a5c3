#!/usr/bin/env python3
"""Every Catch2 test must run under CTest. catch_discover_tests registers each TEST_CASE by its
name, and CTest splits names at ';' into two tests that match nothing and pass without running
(eleven tests went unrun that way until December 2026). This check fails on such names and on
'[' or ']' outside the tags, which Catch would read as a tag filter.

Prints every offending name (file:line) and exits 1 if there is any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent
bad = []
for path in sorted(ROOT.glob("*.cpp")):
    text = path.read_text(encoding="utf-8")
    for m in re.finditer(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"', text):
        name = m.group(1)
        line = text.count("\n", 0, m.start()) + 1
        for ch in ";[]":
            if ch in name:
                bad.append(f"{path.name}:{line}: test name contains '{ch}', which CTest or Catch splits: {name}")
for b in bad:
    print(b)
sys.exit(1 if bad else 0)

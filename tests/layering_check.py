#!/usr/bin/env python3
"""The house rules (docs/NOTES.md, "The house"): which part of moesim may include which.

Libraries depend downwards only: sim <- models <- topologies <- strategies <- tools. Inside
strategies/ the stages follow the data flow: plan <- lower <- output <- {search, rl}; search and
rl do not include each other. A stage's private headers (strategies/src/<stage>/*.hpp) may be
included by its own stage and by later stages (the search screen reuses the lowering's layer
builder). plan/schedule.hpp is pure algorithms: it includes no other moesim header.

Prints every violation (file:line: include, rule) and exits 1 if there is any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBS = ["sim", "models", "topologies", "strategies", "tools"]
STAGES = ["plan", "lower", "output", "search", "rl"]
# stage -> stages it may include (itself included)
STAGE_DEPS = {
    "plan": {"plan"},
    "lower": {"plan", "lower"},
    "output": {"plan", "lower", "output"},
    "search": {"plan", "lower", "output", "search"},
    "rl": {"plan", "lower", "output", "rl"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def part_of(path: pathlib.Path):
    """(library, stage or None) of a source file."""
    rel = path.relative_to(ROOT).parts
    lib = rel[0]
    stage = None
    if lib == "strategies":
        if rel[1] == "src" and len(rel) > 3:
            stage = rel[2]
        elif rel[1] == "include" and len(rel) > 5:
            stage = rel[4]
    return lib, stage


def target_of(inc: str, src: pathlib.Path):
    """(library, stage) an include refers to, or None for a header of the same folder."""
    m = re.match(r"moesim/(\w+)/(?:(\w+)/)?", inc)
    if m:
        lib = m.group(1)
        stage = m.group(2) if lib == "strategies" and m.group(2) in STAGES else None
        return lib, stage
    first = inc.split("/")[0]
    if first in STAGES and "/" in inc:  # a stage's private header, from strategies/src
        return "strategies", first
    if (src.parent / inc).exists():
        return part_of(src.parent / inc)
    return None


def main() -> int:
    problems = []
    files = [p for lib in LIBS for p in (ROOT / lib).rglob("*") if p.suffix in (".hpp", ".cpp")]
    for src in sorted(files):
        lib, stage = part_of(src)
        for n, line in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            tgt = target_of(m.group(1), src)
            if tgt is None:
                continue
            tlib, tstage = tgt
            where = f"{src.relative_to(ROOT)}:{n}: #include \"{m.group(1)}\""
            if tlib in LIBS and LIBS.index(tlib) > LIBS.index(lib):
                problems.append(f"{where}: {lib} may not include {tlib} (libraries depend downwards)")
            elif lib == "strategies" and tlib == "strategies" and stage and tstage and tstage not in STAGE_DEPS[stage]:
                problems.append(f"{where}: strategies/{stage} may not include strategies/{tstage}")
            if src.name == "schedule.hpp" and tlib != "sim":
                problems.append(f"{where}: plan/schedule.hpp is pure algorithms (no moesim includes but sim)")
    for p in problems:
        print(p)
    print(f"layering: {len(files)} files, {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

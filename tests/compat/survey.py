"""Which EndpointPickerConfigs in a directory load in llm-epp, and why the others do not.

    python -m tests.compat.survey DIR [DIR ...] [--strict] [--verbose]

Every file under DIR is searched for EndpointPickerConfig documents: whole YAML files, documents embedded
in Helm values or ConfigMaps (a block scalar holding `kind: EndpointPickerConfig`), Markdown code blocks,
and Go raw strings. Identical documents are counted once. Each is loaded as `llm-epp config check` does
and put in one of these classes:

- `loads` (with the number that only load with warnings);
- `unimplemented plugin types`: every problem is an unknown plugin type (the types are listed);
- `test fixture`: as above, but every unknown type is one of the upstream tests' own (`test-*`, `mock-*`);
- `not supported yet`: a feature llm-epp rejects on purpose until it exists (e.g. flow control);
- `invalid`: any other problem (upstream rejects many of these too: loader test cases);
- `not YAML`: a template or fragment that is not a document on its own.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from llm_epp.config import ConfigError, load_config_text
from llm_epp.framework import NullRecorder
from llm_epp.plugins import builtin_registry

_KIND = re.compile(r"^(?P<indent>[ \t]*)(?:- +)?kind:\s*[\"']?EndpointPickerConfig[\"']?\s*$", re.M)
_GO_RAW = re.compile(r"`([^`]*EndpointPickerConfig[^`]*)`", re.S)
_UNKNOWN_TYPE = re.compile(r"unknown plugin type '([^']+)'")
_FIXTURE_PREFIXES = ("test-", "mock-")
SUFFIXES = (".yaml", ".yml", ".md", ".go", ".tpl", ".txt", ".json")


@dataclass
class Outcome:
    origin: str
    text: str
    verdict: str  # loads | unimplemented | unsupported | invalid | not-yaml
    detail: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _blocks(text: str) -> Iterator[str]:
    """The EndpointPickerConfig documents in `text`, dedented."""
    lines = text.splitlines()
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    for m in _KIND.finditer(text):
        row = next(i for i, off in enumerate(offsets) if off > m.start()) - 1
        indent = len(m.group("indent"))
        start = row
        while start > 0:
            prev = lines[start - 1]
            if not prev.strip():
                break
            if _indent(prev) != indent or prev.strip().startswith(("---", "```", "#")) or prev.rstrip().endswith("|"):
                break
            start -= 1
        end = row + 1
        while end < len(lines):
            line = lines[end]
            stripped = line.strip()
            if stripped.startswith(("```", "---")) and _indent(line) <= indent:
                break
            if stripped and _indent(line) < indent:
                break
            end += 1
        yield textwrap.dedent("\n".join(lines[start:end])).strip("\n") + "\n"


def extract(path: Path) -> list[str]:
    """EndpointPickerConfig documents found in one file."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    if "EndpointPickerConfig" not in text:
        return []
    if path.suffix == ".go":
        return [doc for raw in _GO_RAW.findall(text) for doc in _blocks(raw)]
    return list(_blocks(text))


def classify(origin: str, text: str, strict: bool = False) -> Outcome:
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return Outcome(origin, text, "not-yaml", ["not a YAML document on its own"])
    if not isinstance(parsed, dict):
        return Outcome(origin, text, "not-yaml", ["not a mapping"])
    try:
        loaded = load_config_text(text, builtin_registry(), NullRecorder(), source=origin, strict=strict)
    except ConfigError as e:
        unknown = sorted({m.group(1) for p in e.problems for m in [_UNKNOWN_TYPE.search(p)] if m})
        others = [p for p in e.problems if not _UNKNOWN_TYPE.search(p)]
        if not others:
            fixture = bool(unknown) and all(t.startswith(_FIXTURE_PREFIXES) for t in unknown)
            return Outcome(origin, text, "test-fixture" if fixture else "unimplemented", unknown)
        if all("not supported yet" in p or "is not supported" in p for p in others):
            return Outcome(origin, text, "unsupported", unknown + others)
        return Outcome(origin, text, "invalid", [_short(p) for p in e.problems])
    return Outcome(origin, text, "loads", warnings=list(loaded.warnings))


def _short(problem: str) -> str:
    return problem.split("; known types:")[0]


def survey(roots: list[Path], strict: bool = False) -> list[Outcome]:
    seen: set[str] = set()
    out: list[Outcome] = []
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES)
        for path in files:
            for i, doc in enumerate(extract(path)):
                digest = hashlib.sha256(doc.encode()).hexdigest()
                if digest in seen:
                    continue
                seen.add(digest)
                origin = f"{path.relative_to(root) if root.is_dir() else path.name}#{i}"
                out.append(classify(origin, doc, strict))
    return out


def report(outcomes: list[Outcome], verbose: bool = False) -> str:
    verdicts = Counter(o.verdict for o in outcomes)
    lines = [f"{len(outcomes)} distinct EndpointPickerConfig documents"]
    warned = sum(1 for o in outcomes if o.verdict == "loads" and o.warnings)
    lines.append(f"  loads: {verdicts['loads']} ({warned} with warnings)")
    for verdict in ("unimplemented", "test-fixture", "unsupported", "invalid", "not-yaml"):
        lines.append(f"  {verdict}: {verdicts[verdict]}")
    missing = Counter(
        t for o in outcomes if o.verdict in ("unimplemented", "unsupported") for t in o.detail if " " not in t
    )
    if missing:
        lines.append("plugin types missing (documents needing each):")
        lines.extend(f"  {t}: {n}" for t, n in missing.most_common())
    for o in outcomes:
        if o.verdict != "loads" or verbose:
            lines.append(f"{o.verdict:14} {o.origin}")
            if o.verdict in ("invalid", "unsupported", "not-yaml") or verbose:
                lines.extend(f"{'':16}{d}" for d in o.detail + o.warnings)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--strict", action="store_true", help="unknown plugin parameters are errors")
    parser.add_argument("--verbose", action="store_true", help="list every document, with its warnings")
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)  # plugins' and the loader's log lines; warnings are in the report
    print(report(survey(args.dirs, args.strict), args.verbose))
    return 0


if __name__ == "__main__":
    sys.exit(main())

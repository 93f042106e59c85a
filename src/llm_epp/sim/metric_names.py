"""The `name[]` query parameter of a `/metrics` request, answered as prometheus_client's exposition apps
answer it, for the simulated and stub model servers that render their page as text.

prometheus_client looks up the collectors registered under the requested names (a family's name plus the
sample names of its type: `_total`, `_created`, `_bucket`, `_sum`, `_count`, `_info`, ...) and keeps, of
each family they collect, the samples whose name is requested; a family left without samples is not
written. On a rendered page the same answer is: every family's `# HELP`/`# TYPE` lines and its samples
whose name is requested, or nothing of the family when none is.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import parse_qs

__all__ = ["requested_names", "restrict"]


def requested_names(target: str) -> frozenset[str] | None:
    """The sample names a request target (`/metrics?name[]=a&name[]=b`) asks for, read from its query
    string as prometheus_client reads it; None when it names none (the full page is wanted)."""
    _, sep, query = target.partition("?")
    if not sep:
        return None
    names = parse_qs(query).get("name[]")
    return frozenset(names) if names else None


def _sample_name(line: str) -> str:
    end = len(line)
    for stop in ("{", " ", "\t"):
        at = line.find(stop)
        if 0 <= at < end:
            end = at
    return line[:end]


_SUFFIXES = frozenset(("_total", "_created", "_bucket", "_sum", "_count", "_info", "_gsum", "_gcount"))


def _of_family(sample: str, family: str | None) -> bool:
    return family is not None and (
        sample == family or (sample.startswith(family) and sample[len(family) :] in _SUFFIXES)
    )


def restrict(page: str, names: Collection[str]) -> str:
    """`page` (text exposition 0.0.4) with only the samples whose name is in `names`, each with its family's
    `# HELP`/`# TYPE` lines; "" when none is left (prometheus_client then answers an empty body)."""
    out: list[str] = []
    header: list[str] = []
    family: str | None = None
    written = False  # the current family's header is in `out`
    for line in page.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                if parts[2] != family or written:
                    header, family, written = [], parts[2], False
                header.append(line)
            continue
        name = _sample_name(line)
        if not line.strip() or name not in names:
            continue
        if not _of_family(name, family):  # a sample without its own header
            header, family, written = [], None, True
        if not written:
            out.extend(header)
            written = True
        out.append(line)
    return "\n".join(out) + "\n" if out else ""

"""Kubernetes label selectors in their string form (`app=x,tier!=cache,env in (a,b),!legacy`), parsed once and
matched against endpoint labels."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["LabelSelector", "LabelSelectorError"]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)\s*$")
_CMP = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|!=|=)\s*(?P<value>{_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")

Requirement = Callable[[Mapping[str, str]], bool]


class LabelSelectorError(ValueError):
    pass


def _split(text: str) -> list[str]:
    """The selector's requirements: commas separate them, except inside `( )`."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _requirement(term: str) -> Requirement:
    if m := _SET.match(term):
        key = m["key"]
        values = frozenset(v.strip() for v in m["values"].split(","))
        if not all(_VALUE_RE.match(v) for v in values):
            raise LabelSelectorError(f"{term.strip()!r}: invalid value in the set")
        if m["op"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _CMP.match(term):
        key, value = m["key"], m["value"]
        if m["op"] == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS.match(term):
        key = m["key"]
        if m["neg"]:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise LabelSelectorError(
        f"{term.strip()!r}: expected key=value, key!=value, key in (a,b), key notin (a,b), key or !key"
    )


@dataclass(frozen=True)
class LabelSelector:
    text: str
    requirements: tuple[Requirement, ...]

    @staticmethod
    def parse(text: str) -> LabelSelector:
        """Every requirement must hold; an empty selector matches everything. `LabelSelectorError` says which
        term is malformed."""
        if not text.strip():
            return LabelSelector(text, ())
        return LabelSelector(text, tuple(_requirement(term) for term in _split(text)))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(req(labels) for req in self.requirements)

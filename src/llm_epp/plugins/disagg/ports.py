"""Rewriting a profile's targets to another port (the deprecated data-parallel routing through one port)."""

from __future__ import annotations

import dataclasses

from llm_epp.framework import Endpoint, ProfileResult


def with_port(result: ProfileResult, port: int) -> ProfileResult:
    """The same targets, in order, with `port` as their port (scores kept)."""
    targets = tuple(
        dataclasses.replace(e, metadata=dataclasses.replace(e.metadata, port=port)) for e in result.target_endpoints
    )
    return ProfileResult(targets, result.scores)


def first_hostport(result: ProfileResult) -> str:
    endpoint: Endpoint = result.target_endpoints[0]
    return endpoint.metadata.hostport

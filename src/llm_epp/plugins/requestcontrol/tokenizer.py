"""tokenizer

Scheduling intent:
    The legacy name of `token-producer` (llm-d keeps it as an alias and logs a deprecation warning).
    Everything, parameters included, is `token-producer`'s; see that module.

Inputs consumed:
    As `token-producer`.

Configuration:
    As `token-producer` (modelName, vllm, estimate, tokenizerPath; udsTokenizerConfig is not supported yet).
"""

from __future__ import annotations

import logging

from llm_epp.framework import Handle
from llm_epp.plugins.requestcontrol import token_producer

log = logging.getLogger(__name__)

TYPE = "tokenizer"


class Params(token_producer.Params):
    """`token-producer`'s parameters."""


class Tokenizer(token_producer.TokenProducer):
    """`token-producer` under its legacy type name."""


def factory(name: str, params: Params, handle: Handle) -> Tokenizer:
    log.warning("plugin_type_deprecated type=%s name=%s use=%s", TYPE, name, token_producer.TYPE)
    return Tokenizer(name, params, TYPE)

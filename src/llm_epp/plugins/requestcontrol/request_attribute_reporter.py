"""request-attribute-reporter

Scheduling intent:
    Report a number computed from the model server's response back to the proxy as dynamic metadata,
    e.g. the request's token cost under `envoy.lb` / `x-gateway-inference-request-cost` for usage-based
    load balancing, rate limiting or billing. The number is a Common Expression Language (CEL) expression
    over the response's `usage`, so operators change it without changing the EPP.

Inputs consumed:
    The response usage (ResponseInfo.usage), exposed to CEL as the map `usage` with the keys
    `prompt_tokens`, `completion_tokens`, `total_tokens` (always present; 0 when the response carried no
    usage) and `prompt_tokens_details.cached_tokens` (present when the server reported cached tokens; also
    under GIE v1.5.0's spelling `prompt_token_details`).
    As in the reference (a protobuf Struct), every number is a CEL `double`: write `usage.a + 1.0` or
    `int(usage.a) + 1`; `usage.a + 1` is a type error, which reports nothing.

Configuration:
    attributes (list with exactly one entry):
        key.namespace (string, default `envoy.lb`): the dynamic-metadata namespace.
        key.name (string, required): the key inside the namespace.
        expression (string, required): CEL giving a number; truncated to an integer.
        condition (string, optional): CEL giving a bool; when it is not `true` nothing is reported.
    Expressions are compiled when the configuration loads; a syntax error or a variable other than
    `usage` is refused then.

Outputs produced:
    At the end of the response, RESPONSE_METADATA_KEY[namespace][name] = the value as a number, which the
    protocol adapter sends on its last response message. Results of 0 are not reported (nor -1, which the
    reference uses as its error marker), nor are results that are not numbers or evaluation errors (logged).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.framework.requestcontrol import RESPONSE_METADATA_KEY, ResponseInfo, Usage

if TYPE_CHECKING:
    from cel import Program

TYPE = "request-attribute-reporter"
DEFAULT_NAMESPACE = "envoy.lb"
_VARIABLE = "usage"

log = logging.getLogger(__name__)


def usage_variable(usage: Usage | None) -> dict[str, Any]:
    """The `usage` map the expressions see: the reference's JSON of its Usage, with numbers as doubles."""
    u = usage or Usage()
    out: dict[str, Any] = {
        "prompt_tokens": float(u.prompt_tokens),
        "completion_tokens": float(u.completion_tokens),
        "total_tokens": float(u.total_tokens),
    }
    if u.cached_tokens:
        details = {"cached_tokens": float(u.cached_tokens)}
        out["prompt_tokens_details"] = details  # llm-d-router's key
        out["prompt_token_details"] = details  # GIE v1.5.0's key
    return out


def compile_expression(source: str) -> Program:
    """Compiles `source`; raises ValueError saying what is wrong (syntax, or an unknown variable)."""
    import cel  # imported on first use: the CEL runtime costs a quarter second to import

    try:
        program = cel.compile(source)
    except ValueError as e:
        raise ValueError(f"not a valid CEL expression: {e}") from None
    try:  # a dry run on zero usage finds references to variables that do not exist
        program.execute({_VARIABLE: usage_variable(None)})
    except RuntimeError as e:
        if "Undefined variable" in str(e):
            raise ValueError(f"only the variable {_VARIABLE!r} is available ({e})") from None
    except (TypeError, KeyError, ValueError):
        pass  # depends on the data (a type mismatch, a missing key): evaluated per response
    return program


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class AttributeKey(_Model):
    namespace: str = DEFAULT_NAMESPACE
    name: str = Field(min_length=1)


class Attribute(_Model):
    key: AttributeKey
    expression: str = Field(min_length=1)
    condition: str = ""

    @field_validator("expression", "condition")
    @classmethod
    def _compiles(cls, value: str) -> str:
        if value:
            compile_expression(value)
        return value


class Params(PluginParams):
    attributes: tuple[Attribute, ...] = Field(default=(), validate_default=True)

    @field_validator("attributes")
    @classmethod
    def _exactly_one(cls, value: tuple[Attribute, ...]) -> tuple[Attribute, ...]:
        if len(value) != 1:
            raise ValueError(f"attributes must contain exactly one entry (got {len(value)})")
        return value


class RequestAttributeReporter:
    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        attribute = params.attributes[0]
        self.namespace = attribute.key.namespace or DEFAULT_NAMESPACE
        self.key = attribute.key.name
        self.expression = compile_expression(attribute.expression)
        self.condition = compile_expression(attribute.condition) if attribute.condition else None

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def value(self, usage: Usage | None) -> int | None:
        """The value to report for `usage`, or None when nothing is reported."""
        data = {_VARIABLE: usage_variable(usage)}
        try:
            if self.condition is not None and self.condition.execute(data) is not True:
                return None
            result = self.expression.execute(data)
        except (RuntimeError, TypeError, KeyError, ValueError) as e:
            log.warning("request_attribute_eval_failed plugin=%s error=%s", self._typed_name, e)
            return None
        if isinstance(result, bool) or not isinstance(result, int | float):
            log.warning("request_attribute_not_a_number plugin=%s result=%r", self._typed_name, result)
            return None
        if isinstance(result, float) and not math.isfinite(result):
            return None
        value = int(result)  # truncation toward zero, as Go's int64(float64)
        return None if value in (0, -1) else value

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        value = self.value(response.usage)
        if value is None:
            return
        metadata = cycle.read(RESPONSE_METADATA_KEY)
        if metadata is None:
            metadata = {}
            cycle.write(RESPONSE_METADATA_KEY, metadata)
        metadata.setdefault(self.namespace, {})[self.key] = float(value)


def factory(name: str, params: Params, handle: Handle) -> RequestAttributeReporter:
    return RequestAttributeReporter(name, params)

"""dcgm-extractor

Scheduling intent:
    Turn a DCGM Exporter page into the endpoint's GPU utilization, a number in [0, 1] that the generic
    `endpoint-attribute-filter` / `-scorer` read (attribute `GPUUtilization`, producer `dcgm-extractor`),
    e.g. to drop endpoints above 90 % GPU utilization or prefer the least busy GPUs.

Inputs consumed:
    The `DCGM_FI_DEV_GPU_UTIL` gauge (percent, one series per GPU) of a page from `dcgm-data-source`.
    Series with a `pod` label count only for the endpoint of that pod (a DaemonSet exporter reports every
    pod of the node; `DCGM_EXPORTER_KUBERNETES=true` adds the label); series without it count for the
    endpoint scraped (a sidecar exporter). The busiest GPU wins: utilization = max / 100.

Configuration:
    No parameters.

"""

from __future__ import annotations

import math
import re

from llm_epp.framework import EndpointMetadata, Handle, PluginParams, TypedName
from llm_epp.framework.datalayer import ScrapedPage
from llm_epp.plugins.datalayer._attributes import AttributeExtraction, attribute_key

TYPE = "dcgm-extractor"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
POD_LABEL = "pod"
ATTRIBUTE = "GPUUtilization"
KEY = attribute_key(ATTRIBUTE, TYPE)

_RANK_SUFFIX = re.compile(r"-rank-\d+\Z")


class Params(PluginParams):
    pass


def pod_name(endpoint: EndpointMetadata) -> str:
    """The pod an endpoint belongs to (an endpoint of a multi-rank pod is named `<pod>-rank-<i>`)."""
    return _RANK_SUFFIX.sub("", endpoint.key.name)


class DcgmExtractor:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def families(self, endpoint: EndpointMetadata) -> frozenset[str]:
        return frozenset({GPU_UTIL})

    def extract_attributes(self, page: ScrapedPage, endpoint: EndpointMetadata) -> AttributeExtraction:
        samples = page.samples.get(GPU_UTIL)
        if not samples:
            return AttributeExtraction(problems=(f"metric {GPU_UTIL!r} not found in the DCGM page",))
        pod = pod_name(endpoint)
        values = [s.value for s in samples if (s.labels.get(POD_LABEL) in (None, pod)) and not math.isnan(s.value)]
        if not values:
            return AttributeExtraction(problems=(f"metric {GPU_UTIL!r} has no series for pod {pod!r}",))
        return AttributeExtraction({KEY: max(values) / 100.0})


def factory(name: str, params: Params, handle: Handle) -> DcgmExtractor:
    return DcgmExtractor(name)

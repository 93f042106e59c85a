"""k8s-notification-source

Scheduling intent:
    Watch one kind of Kubernetes object (e.g. core/v1 Pods) in the pool's namespace and hand its add, update
    and delete events to the extractors listed under it (those of the same kind), so they can publish endpoint
    attributes from object fields the pool does not carry (a pod's `spec.hostname`, a node's labels, ...).

Inputs consumed:
    The Kubernetes API (the EPP's own credentials), list-then-watch of `group`/`version`/`kind` in
    `--pool-namespace`. An object listed or changed gives an `add-or-update` event with the whole object;
    one deleted (or gone at a relist) a `delete` event; an update that does not change the object's
    resourceVersion gives none. Needs the EPP to run with Kubernetes discovery (`--pool-name` or
    `--endpoint-selector`); otherwise the EPP refuses to start.

Configuration:
    group (string, "" for the core API group), version (required, e.g. `v1`), kind (required, e.g. `Pod`).
    At most one such source per kind; its extractors must read that kind.
"""

from __future__ import annotations

from pydantic import Field

from llm_epp.framework import Handle, PluginParams, TypedName
from llm_epp.framework.datalayer import GroupVersionKind, ObjectEvent

TYPE = "k8s-notification-source"


class Params(PluginParams):
    group: str = ""
    version: str = Field(min_length=1)
    kind: str = Field(min_length=1)


class K8sNotificationSource:
    def __init__(self, name: str, gvk: GroupVersionKind) -> None:
        self._typed_name = TypedName(TYPE, name)
        self._gvk = gvk

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def gvk(self) -> GroupVersionKind:
        return self._gvk

    def notify_object(self, event: ObjectEvent) -> ObjectEvent | None:
        return event


def factory(name: str, params: Params, handle: Handle) -> K8sNotificationSource:
    return K8sNotificationSource(name, GroupVersionKind(params.group, params.version, params.kind))

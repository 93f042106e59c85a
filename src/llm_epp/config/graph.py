"""The data graph: which plugin produces the per-request data another consumes.

Plugins declare `produces` and `consumes` (sets of data-key names, e.g. `prefix-cache-match-info`). From
those declarations alone the loader
- adds a missing producer: a key some plugin consumes and no configured plugin produces gets its default
  producer (`DEFAULT_PRODUCERS`, as llm-d-router's `RegisterAsDefaultProducer`), created transitively.
  The producer is built with the parameters of a consumer whose Params model extends the producer's
  (GIE passes `prefix-cache-scorer`'s parameters to the approx producer it creates), else with none;
- rejects a consumed key that nothing can produce. A key `data/name` is the data of the producer
  instance named `name` (a consumer's `...ProducerName` parameter): only that instance publishes it, and a
  producer of the same type under another name does not stand in for the default one;
- orders the plugins so every producer runs before its consumers (GIE's `data_graph.go`), rejecting
  cycles and producers whose extension point runs after their consumer's (a scorer cannot feed
  PrepareData).
A new producer/consumer pair needs only its declarations and, to be created on demand, one table line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from llm_epp.framework import Filter, Picker, Plugin, ProfileHandler, Scorer
from llm_epp.framework.requestcontrol import Admission, PrepareData, PreRequest, ResponseComplete, ResponseReceived

REQUEST_CONTROL_LAYER = 1
SCHEDULING_LAYER = 2
OTHER_LAYER = -1


def produces(plugin: object) -> frozenset[str]:
    return frozenset(getattr(plugin, "produces", None) or ())


def consumes(plugin: object) -> frozenset[str]:
    return frozenset(getattr(plugin, "consumes", None) or ())


def layer(plugin: object) -> int:
    """When a plugin's work happens in a request: request control (PrepareData ... response hooks) before
    scheduling (profile handler, filters, scorers, picker)."""
    if isinstance(plugin, (PrepareData, Admission, PreRequest, ResponseReceived, ResponseComplete)):
        return REQUEST_CONTROL_LAYER
    if isinstance(plugin, (ProfileHandler, Filter, Scorer, Picker)):
        return SCHEDULING_LAYER
    return OTHER_LAYER


def add_missing_producers(
    plugins: dict[str, Plugin],
    types: dict[str, str],
    params: dict[str, dict[str, Any]],
    default_producers: Mapping[str, str],
    params_extend: Callable[[str, str], bool],
    build: Callable[[str, Mapping[str, Any] | None], tuple[str, Plugin, dict[str, Any]] | str],
) -> list[str]:
    """Adds default producers for consumed keys nothing produces (into `plugins`, `types`, `params`);
    returns the problems. `params_extend(consumer_type, producer_type)`: the consumer's Params model
    extends the producer's. `build(type, params)` returns (name, plugin) or a message."""
    problems: list[str] = []
    given_up: set[str] = set()
    while True:
        produced = {key for p in plugins.values() for key in produces(p)}
        missing: dict[str, list[str]] = {}
        for name, plugin in plugins.items():
            for key in sorted(consumes(plugin) - produced - given_up):
                missing.setdefault(key, []).append(name)
        if not missing:
            return problems
        created = 0
        for key, consumers in missing.items():
            who = ", ".join(f"{c!r} ({types[c]})" for c in consumers)
            producer_type = default_producers.get(key)
            data, _, producer = key.partition("/")
            if producer_type is None and producer:
                problems.append(
                    f"plugins: {who} reads {data!r} from the producer named {producer!r}, but no declared "
                    f"plugin named {producer!r} produces it; declare that producer under `plugins` with "
                    f"`name: {producer}`, or correct the producer name"
                )
                given_up.add(key)
                continue
            if producer_type is None:
                problems.append(
                    f"plugins: {who} consumes {key!r}, which no configured plugin produces and no plugin type "
                    "is the default producer of; add a plugin that produces it"
                )
                given_up.add(key)
                continue
            same_type = [n for n, t in types.items() if t == producer_type and n == producer_type]
            if same_type:
                problems.append(
                    f"plugins: {who} consumes {key!r}; its default producer {producer_type!r} is configured "
                    f"({same_type[0]!r}) but does not produce it"
                )
                given_up.add(key)
                continue
            donors = [c for c in consumers if params_extend(types[c], producer_type)]
            raw = params.get(donors[-1]) if donors else None
            built = build(producer_type, raw or None)
            if isinstance(built, str):
                problems.append(f"plugins: the {producer_type} created for {who} failed: {built}")
                given_up.add(key)
                continue
            name, plugin, used = built
            plugins[name] = plugin
            types[name] = producer_type
            params[name] = used
            if key not in produces(plugin):
                problems.append(f"plugins: {producer_type!r}, the default producer of {key!r}, does not produce it")
                given_up.add(key)
                continue
            created += 1
        if not created:
            return problems


def data_order(plugins: Mapping[str, Plugin], types: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """Plugin names with every producer before its consumers (ties keep configuration order), and the
    problems (cycles, a producer that runs after its consumer)."""
    names = list(plugins)
    position = {n: i for i, n in enumerate(names)}
    needs: dict[str, set[str]] = {n: set() for n in names}  # consumer -> its producers
    problems: list[str] = []
    for c in names:
        wanted = consumes(plugins[c])
        if not wanted:
            continue
        for p in names:
            if p == c:
                continue
            shared = produces(plugins[p]) & wanted
            if not shared:
                continue
            if layer(plugins[p]) > layer(plugins[c]):
                problems.append(
                    f"plugins: {p!r} ({types[p]}) produces {sorted(shared)[0]!r} while scheduling, after "
                    f"{c!r} ({types[c]}) needs it in request control; the producer must run first"
                )
                continue
            needs[c].add(p)
    order: list[str] = []
    done: set[str] = set()
    pending = sorted(names, key=position.__getitem__)
    while pending:
        ready = [n for n in pending if needs[n] <= done]
        if not ready:
            cycle = ", ".join(f"{n!r} ({types[n]})" for n in pending)
            problems.append(
                f"plugins: the data dependencies of {cycle} form a cycle; no order runs each producer first"
            )
            order.extend(pending)
            break
        order.append(ready[0])
        done.add(ready[0])
        pending.remove(ready[0])
    return order, problems

"""The data layer: the endpoint store, discovery sources and (later) metric scrapers."""

from llm_epp.datalayer.datastore import Datastore

__all__ = ["Datastore"]

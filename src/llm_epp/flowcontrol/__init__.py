"""Flow control: when every endpoint is busy, requests wait in the EPP's own queues (ordered by priority
band, fair between flows, each with a time to live) instead of piling onto the model servers."""

from llm_epp.flowcontrol.config import BandConfig, FlowControlConfig
from llm_epp.flowcontrol.controller import FlowController, FlowControlObserver, QueueOutcome, Ticket

__all__ = ["BandConfig", "FlowControlConfig", "FlowControlObserver", "FlowController", "QueueOutcome", "Ticket"]

"""llm-epp: an Endpoint Picker for LLM inference pools."""

__version__ = "0.1.0"

"""An example llm-epp plugin package."""

"""EndpointPickerConfig: the reference YAML schema, its loader and the default configuration."""

from llm_epp.config.loader import ConfigError, LoadedConfig, load_config, load_config_text

__all__ = ["ConfigError", "LoadedConfig", "load_config", "load_config_text"]

"""Gateway-side helpers: configuration for the Envoy proxy that calls the EPP."""

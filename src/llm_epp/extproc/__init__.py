"""The Envoy ext_proc protocol adapter. Only this package sees protobuf."""

"""Stand-ins for model servers, for demos, tests and benchmarks where no GPU is available."""

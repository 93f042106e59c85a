"""Helpers shared by the test suites: free ports, a real Envoy process, stub model servers."""

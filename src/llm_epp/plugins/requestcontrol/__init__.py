"""In-tree request-control plugins: data producers and hooks that run around scheduling."""

"""memsnap: PyTorch-compatible device caching allocator and memory snapshots."""

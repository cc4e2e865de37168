"""Benchmarks: qkv side by side with its peers, interleaved, medians, ratio printed last."""

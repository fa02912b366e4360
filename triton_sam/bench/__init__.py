"""Benchmarks: latency percentiles against an in-process baseline, reports and plots."""

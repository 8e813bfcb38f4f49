"""kqv's applications: the lecture's experiments, the invented worlds and the benchmarks' harness, built on kqv's
public API."""

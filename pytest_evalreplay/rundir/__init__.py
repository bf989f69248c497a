"""The run dir: the writer, reading it back, shard dirs, merging, baselines."""

"""Plain values every layer uses: config hashes, a rollout's shard, one-line cuts, credentials hidden."""

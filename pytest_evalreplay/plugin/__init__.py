"""The pytest side: hooks, items, xdist, scheduling, options, our hook specs."""

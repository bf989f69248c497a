"""The run: sessions, task and ELO runs, rollouts, generation, agent episodes, judging, finishing."""

"""The ELO rating: Bradley-Terry fit, bootstrap, solver, rating tables, the rating of a run."""

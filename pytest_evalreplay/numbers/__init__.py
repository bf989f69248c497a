"""The numbers: metrics, reuse planning, gates, statistics, pass@k, the ELO fit and rating."""

"""Reporting: the terminal summary, progress, compare and its rendering."""

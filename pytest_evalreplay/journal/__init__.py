"""The journal: its rows, its index, the writer, agent turns and ELO stage records."""

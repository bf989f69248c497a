"""Root conftest: plugin tests drive pytest in a sandbox through `pytester`."""

# Imported here, once, so the in-process pytester runs find hypothesis in
# sys.modules instead of re-importing (and assertion-rewriting) it on every
# run through its pytest plugin's terminal summary: about 1 s per run.
import hypothesis  # noqa: F401

pytest_plugins = ["pytester"]

"""Root conftest: plugin tests drive pytest in a sandbox through `pytester`."""

pytest_plugins = ["pytester"]

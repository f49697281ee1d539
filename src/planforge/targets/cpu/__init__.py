"""The CPU target: C templates built with the system compiler, measured in isolated, pinned worker processes."""

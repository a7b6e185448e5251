"""The project layer: module resolution, summaries, and the facts other modules give a file
(see `project.py`). `Project` is imported on first use: the import graph (`graph.py`) and the
layout (`layout.py`) are read by the cache on a warm run, which imports no LibCST."""

from typing import Any

__all__ = ["Project"]


def __getattr__(name: str) -> Any:
    if name == "Project":
        from ampfix.project.project import Project

        return Project
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

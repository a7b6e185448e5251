"""The project layer: module resolution, summaries, and the facts other modules give a file
(see `project.py`)."""

from ampfix.project.project import Project

__all__ = ["Project"]

"""Output formats: the reports of `check` and `rewrite` (text, json, sarif, github, ...).
"""

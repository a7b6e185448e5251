"""Front ends: the command line, the language server and the flake8 plugin. They parse options
and speak protocols; the analysis is the engine's.
"""

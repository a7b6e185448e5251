"""The engine: discovery, configuration, the plan and the run, the cache, `# noqa`, file I/O,
notebooks, and analysing one file (parse once, run the rules, apply fixes safely).

Import-light: the package itself imports nothing; LibCST and the rules come in only with
`ampfix.engine.analyze.analyze`, when a file must really be analysed.
"""

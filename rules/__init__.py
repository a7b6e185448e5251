"""ampfix's rules, one module per rule (shipped as `ampfix.rules`).

A module defines one `ampfix.rule.Rule` subclass; `ampfix.engine.registry` finds it by itself,
so adding a rule touches its module and its fixtures only.
"""

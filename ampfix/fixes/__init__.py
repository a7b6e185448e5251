"""The edits layer: how rules build fixes (insert a statement, rename a call, add an
argument) without breaking the file.
"""

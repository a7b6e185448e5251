"""ampfix: find and fix PyTorch automatic mixed precision (AMP) mistakes."""

__version__ = "0.2.0"

#: the repository: the README's install lines and each rule's documentation `url` point here
REPOSITORY = "https://github.com/ampfix/ampfix"


def rule_url(code: str) -> str:
    """The documentation page of a rule: `rules/docs/CODE.md` in the repository (the text of
    `ampfix explain CODE`; tests/test_rule_docs.py keeps them in step)."""
    return f"{REPOSITORY}/blob/main/rules/docs/{code}.md"

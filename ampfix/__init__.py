"""ampfix: find and fix PyTorch automatic mixed precision (AMP) mistakes."""

import os as _os
import sys as _sys

__version__ = "0.2.0"

#: the repository: the README's install lines and each rule's documentation `url` point here
REPOSITORY = "https://github.com/ampfix/ampfix"


def rule_url(code: str) -> str:
    """The documentation page of a rule: `rules/docs/CODE.md` in the repository (the text of
    `ampfix explain CODE`; tests/test_rule_docs.py keeps them in step)."""
    return f"{REPOSITORY}/blob/main/rules/docs/{code}.md"


class _CheckoutRules:
    """`ampfix.rules` in a source checkout that was not `pip install`ed (on PYTHONPATH, say).

    The rules live in the repository's top-level `rules/` folder; an install (wheel or
    editable) maps that folder to `ampfix.rules` (pyproject's package-dir), a bare checkout has
    no such mapping. This import hook is that mapping, the one place that knows it: appended
    last to `sys.meta_path`, it answers only for `ampfix.rules`, and only when nothing before
    it did (an installed copy always wins). The rules' own modules are then found in the
    folder as in any package."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(self, name, path=None, target=None):
        if name != __name__ + ".rules":
            return None
        from importlib.util import spec_from_file_location

        return spec_from_file_location(name, _os.path.join(self.folder, "__init__.py"),
                                       submodule_search_locations=[self.folder])


def _map_checkout_rules() -> None:
    here = _os.path.dirname(_os.path.abspath(__file__))
    folder = _os.path.join(_os.path.dirname(here), "rules")
    if _os.path.isdir(_os.path.join(here, "rules")) or not _os.path.isfile(_os.path.join(folder, "__init__.py")):
        return  # installed from a wheel (ampfix/rules is here), or no checkout around it
    if not any(isinstance(f, _CheckoutRules) for f in _sys.meta_path):
        _sys.meta_path.append(_CheckoutRules(folder))


_map_checkout_rules()

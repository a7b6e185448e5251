"""Line/column positions of the nodes that are reported, without a pass over the whole file.

LibCST's PositionProvider renders the whole module once with a hook on every node: on a file
of 170k short statements that is 35% of the analysis time and a quarter of its memory, for
the handful of nodes a finding names. Here a position costs the rendering of one top-level
statement with the same hook: the statement's first line is the number of lines that the
module's header and the statements before it render to (counted once, in order, as far as
needed, without any hook), and its nodes are rendered from there, exactly as the provider
would render them inside the module (same default indentation and line break, column 0).
A node outside every top-level statement (the module itself, its header and footer lines)
falls back to the provider.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import NEWLINE_RE, PositionProvidingCodegenState


class Positions:
    def __init__(self, module: cst.Module, parent: Callable[[cst.CSTNode], Optional[cst.CSTNode]]):
        self.module = module
        self._parent = parent
        self._provider = PositionProvider()  # its `_computed` map holds the ranges of rendered statements
        self._index: Optional[Dict[int, int]] = None  # id(top-level statement) -> its index in the body
        self._starts: List[int] = []  # the first line of body[0], body[1], ... as far as counted
        self._rendered: set = set()
        self._whole: Optional[Dict[cst.CSTNode, CodeRange]] = None

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        found = self._provider._computed.get(node)
        if found is not None:
            return found
        top = self._top(node)
        if top is None:
            return self._fallback(node)
        i = self._index[id(top)]
        if i not in self._rendered:
            state = PositionProvidingCodegenState(default_indent=self.module.default_indent,
                                                  default_newline=self.module.default_newline,
                                                  provider=self._provider)
            state.line = self._start(i)
            state.column = 0
            top._codegen(state)
            self._rendered.add(i)
        found = self._provider._computed.get(node)
        return found if found is not None else self._fallback(node)

    def _top(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The top-level statement (a child of the module's body) that holds `node`."""
        if self._index is None:
            self._index = {id(s): i for i, s in enumerate(self.module.body)}
        cur: Optional[cst.CSTNode] = node
        while cur is not None:
            if id(cur) in self._index and self.module.body[self._index[id(cur)]] is cur:
                return cur
            cur = self._parent(cur)
        return None

    def _start(self, i: int) -> int:
        if not self._starts:
            header = "".join(self.module.code_for_node(h) for h in self.module.header)
            self._starts.append(1 + len(NEWLINE_RE.findall(header)))
        body = self.module.body
        while len(self._starts) <= i:
            k = len(self._starts) - 1
            self._starts.append(self._starts[k] + len(NEWLINE_RE.findall(self.module.code_for_node(body[k]))))
        return self._starts[i]

    def _fallback(self, node: cst.CSTNode) -> CodeRange:
        if self._whole is None:
            self._whole = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
        return self._whole[node]

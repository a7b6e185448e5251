"""The shared model of a training file that every rule queries.

Built once per parsed file, from one indexing pass; every other fact is computed on first use
and cached. The core, one class whose parts are one module each, answers what most rules ask:

* `tree`: the indexing pass; parents, text order, statements, blocks, scopes, loops;
* `names`: what a name refers to through imports (canonical torch APIs whatever the import
  style), import bindings and their references, the file's spellings (torch alias, quotes);
* `values`: what a name, `self.` attribute or module global may hold, file-wide, through
  assignments, parameters (the arguments at call sites), `functools.partial` and conditional
  expressions;
* `conditions`: the values a name can hold when every one is known (literals, complete
  bindings, `choices=` of an option, the keys of a table read before) and the tests they decide
  (`enabled=(args.dtype == "float16")` never true when `--dtype` takes fp16/bf16/fp32);
* `callgraph`: which functions and methods of this file a call runs (closures, `self.m()`,
  `obj.m()`, `obj(...)`, `super()`), with arguments bound to parameters;
* `regions`: autocast regions (with, decorators, partial, module-global contexts);
* `objects`: GradScalers, optimizers, backward calls, CUDA initialisation;
* `flow`: conditional contexts and exits, for path questions;
* `events`: per-function AMP event summaries, and traces that inline them through calls;
* `iterations`: the training iteration an event runs in, its ends (for "before the next
  iteration" questions), gradient-accumulation boundaries;
* `environ`: reads and writes of the process environment (`os.environ`, `getenv`, copies);
* `foreign`: the facts of other modules, from the project (`ampfix/project/`).

The facts of a family of questions that few rules ask are facets (`facet.Facet`), built on
first use, each reading the core through its `model`, so their names stay out of the core's:

* `model.precision` (`precision`): the dtypes the file chooses (`amp_dtype`, `{...}[dtype]`
  tables) and the dtype and device of each autocast region;
* `model.dataflow` (`dataflow`): where a value goes within its function (and through
  `return`), and whether it is ever multiplied or divided by some factor (`get_scale()`);
* `model.checkpoints` (`checkpoints`): what `torch.save` stores (model, optimizer, scaler
  state) and what a resume restores;
* `model.updates` (`updates`): where a `scaler.update()` is misplaced;
* `model.training` (`training`): which models the file trains; where one is copied, evaluated,
  frozen or rewrapped;
* `model.guards` (`guards`): old-torch fallback code that must not be modernised;
* `model.bound` (`bound`): what a name or `self.` attribute may be at a point (assigned on
  every path? None on some?), for fixes that insert code;
* `model.apex` (`apex_uses`): uses of NVIDIA apex outside `apex.amp` (which AMP103 migrates,
  which only name apex for compatibility), its optional imports and optimizer factories;
* `model.parallel` (`parallel`): code run in other threads (`nn.DataParallel` replicas,
  `parallel_apply`, threads of the file's own): the module a DataParallel wraps, the function
  a thread runs, whether a function opens its own autocast region;
* `model.autograd` (`autograd`): the custom autograd Functions of the file and the
  `custom_fwd`/`custom_bwd` decorators of their `forward` and `backward`;
* `model.entered` (`entered`): autocast contexts entered by hand (`ctx.__enter__()`) and
  whether the code may exit them.

Helpers over nodes: `readwrite` (names read and bound by a statement), `syntax` (`dotted`,
`get_arg`, literals).
"""

from __future__ import annotations

from functools import cached_property
from typing import Optional

import libcst as cst

from ampfix.model.apex_uses import ApexLeftover, ApexOptionalImport, ApexRole, ApexUse, ApexUses
from ampfix.model.autograd import CustomFunctions
from ampfix.model.bound import Bound
from ampfix.model.callgraph import CallGraph
from ampfix.model.checkpoints import Checkpoints
from ampfix.model.conditions import Conditions, NeverTrue
from ampfix.model.dataflow import Dataflow
from ampfix.model.entered import HandEntries, HandEntry
from ampfix.model.environ import Environ
from ampfix.model.events import Event, Events, Trace, TraceEvent, anchor
from ampfix.model.flow import Flow
from ampfix.model.foreign import Foreign, ForeignFacts
from ampfix.model.guards import Guards
from ampfix.model.iterations import Iterations, Misplaced, group_frame, group_loop
from ampfix.model.training import Training
from ampfix.model.updates import UpdateMisplaced, UpdatePlace, Updates
from ampfix.model.names import API_TABLE, Api, ImportBinding, Names
from ampfix.model.objects import BackwardCall, Objects
from ampfix.model.parallel import Parallel
from ampfix.model.precision import Precision
from ampfix.model.readwrite import names_bound, reads_writes, uses_only
from ampfix.model.regions import Region, Regions
from ampfix.model.syntax import call_name, get_arg, is_expression_statement_of, literal_bool, literal_string, \
    method_call, receiver
from ampfix.model.tree import Index, Tree, dotted
from ampfix.model.values import Values


class AmpModel(Tree, Names, Values, CallGraph, Regions, Objects, Flow, Events, Environ, Iterations, Foreign, Conditions):
    """Facts about one parsed file (see the package docstring for its parts). `foreign`: the
    project the file belongs to (`ampfix/project/`), which answers for the other modules;
    `path`: the file's path (absolute), as the project knows it."""

    def __init__(self, module: cst.Module, foreign: Optional[ForeignFacts] = None, path: str = "",
                 index: Optional[Index] = None):
        self._init_foreign(foreign, path)
        self._init_tree(module, index)
        self._init_names()
        self._init_values()
        self._init_callgraph()
        self._init_objects()
        self._init_flow()
        self._init_events()

    @cached_property
    def training(self) -> Training:
        """Which models the file trains; where one is copied, evaluated, frozen, rewrapped."""
        return Training(self)

    @cached_property
    def precision(self) -> Precision:
        """The dtypes the file chooses and each autocast region's dtype and device."""
        return Precision(self)

    @cached_property
    def checkpoints(self) -> Checkpoints:
        """What `torch.save` stores (model, optimizer, scaler state), what a resume restores."""
        return Checkpoints(self)

    @cached_property
    def updates(self) -> Updates:
        """Where a `scaler.update()` runs against the optimizer steps of its iteration."""
        return Updates(self)

    @cached_property
    def apex(self) -> ApexUses:
        """Uses of NVIDIA apex outside `apex.amp`, its optional imports and factories."""
        return ApexUses(self)

    @cached_property
    def dataflow(self) -> Dataflow:
        """Where a value goes within its function and through `return`."""
        return Dataflow(self)

    @cached_property
    def bound(self) -> Bound:
        """What a name or `self.` attribute may be at a point, for fixes that insert code."""
        return Bound(self)

    @cached_property
    def guards(self) -> Guards:
        """Old-torch fallback code, stage and version branches (code that must not be modernised)."""
        return Guards(self)

    @cached_property
    def parallel(self) -> Parallel:
        """DataParallel replicas and threads: what they run, whether it opens its own region."""
        return Parallel(self)

    @cached_property
    def autograd(self) -> CustomFunctions:
        """Custom autograd Functions and their `custom_fwd`/`custom_bwd` decorators."""
        return CustomFunctions(self)

    @cached_property
    def entered(self) -> HandEntries:
        """Autocast contexts entered by hand (`ctx.__enter__()`) and whether they may be exited."""
        return HandEntries(self)

    def _reads_of(self, node: cst.CSTNode) -> set:
        """The names `node` (a statement or expression) reads (computed once per node)."""
        cache = self.__dict__.setdefault("_reads_cache", {})
        hit = cache.get(id(node))
        if hit is None or hit[0] is not node:
            hit = cache[id(node)] = (node, frozenset(reads_writes(node)[0]))
        return hit[1]


__all__ = [
    "API_TABLE", "AmpModel", "Api", "ApexLeftover", "ApexOptionalImport", "ApexRole", "ApexUse", "BackwardCall", "Event",
    "HandEntry", "ImportBinding", "Misplaced", "NeverTrue", "Region", "Trace", "TraceEvent", "UpdateMisplaced", "UpdatePlace",
    "anchor", "call_name", "dotted", "get_arg", "group_frame", "group_loop", "is_expression_statement_of", "literal_bool", "literal_string",
    "method_call", "names_bound", "reads_writes", "receiver", "uses_only",
]

"""Proof, from a block's source code, that its GroupNorm output only ever goes straight into a SiLU.

gnsilu.torch.swap_group_norm_silu replaces such a GroupNorm attribute (say `norm1`) with a module computing
silu(group_norm(x)) that lets the new SiLU know the tensor it returned, and the SiLU attribute (say
`nonlinearity`) with one that passes that very tensor through unchanged and applies SiLU to anything else (a view
or copy of it included). The result stays the same (up to gnsilu's rounding) provided every value the new `norm1`
returns is handed at once, as it is, to that SiLU and to nothing else.
This module proves that with Python's ast, for the code as written (no torch.fx, no tracing), or gives up.

A use of `self.norm` counts as proven when it is
  - `self.act(self.norm(e))` (one argument each, anywhere), or
  - `v = self.norm(e)` in forward whose next statement is `v = self.act(v)` or `return self.act(v)`, with only
    statements `v = v.permute(...).unflatten(...)` (methods that always return a view, pure arguments) between
    them: the act then gets a view of the norm's output, which the swapped SiLU also passes through. "Next" follows
    the control flow: past the end of an if/else branch to the statement after it, and past an `if` whose test the
    block's current configuration decides (`self.kind == "default"`, `self.up is None`, `x is not None and ...`),
    whose dead branch is then ignored. Such tests must be pure: identity tests and comparisons of plain
    attributes with constants only, nothing that calls code or reads tensor values;
The act may also be a call of torch.nn.functional.silu with the one argument (`F.silu(self.norm(e))`, `v =
F.silu(v)`): a name chain (`F.silu`, `torch.nn.functional.silu`) that the method does not bind itself (parameters,
assignments, imports; none at all with `global`/`nonlocal`) and that resolves through its module's globals, module
by module (their __dict__: no code runs), to that very function. Its act is FUNCTIONAL_SILU.
Otherwise a use is harmless only as a read of a GroupNorm attribute (`self.norm.weight`, `.eps`, ...), or a call with other than
one argument (a TypeError either way).
A norm is swapped when it has a proven use and no other use in any method of the block's classes (up to `base`).
__init__ runs before any swap, so what it does itself is not examined, but the code it leaves behind to run later
is: the functions, lambdas, classes and generator expressions written in __init__ are examined like methods (a
`self.norm` in them is a use like any other), and where __init__ writes any, it may not use `self` as a value
(an alias such as `me = self` would reach the norm from them unseen). Nothing is swapped when the code cannot be
read or checked: source unavailable, methods not from that source, decorated methods (other than
property/staticmethod/classmethod), `self` used other than as `self.attr` (or in type/isinstance/id/super),
dynamic access (self.__dict__, self._modules, self.children(), ...), a method assigning or deleting the SiLU
attribute, or lambdas in the class body.

Limits (stated in python/README.md): the configuration attributes read to decide an `if` must not change after
the swap, and nor may the module global that names F.silu; code outside the block's classes that calls block.norm
directly is not seen.

proven_bias_moves proves, with the same reading of the code, that a convolution attribute's output goes to one norm
attribute and nowhere else: its every use is `v = self.conv(e)` in forward, followed, while some of forward's
parameters are None at run time, by `v = self.norm(v)` (only `if` statements that those parameters decide, or
that the configuration decides, lie between; forward never rebinds the parameters; no method replaces the norm).
The swap then lets the norm add the convolution's bias (gnsilu's input_bias) in the calls where the parameters are
None, which a forward pre-hook of the block reads from the call's arguments.
"""
import ast
import functools
import inspect
import os
import sys
import textwrap
import types

UNKNOWN = object()  # what lookup() returns for an attribute that is not a plain instance attribute

_PLAIN = (str, int, float, bool, type(None))
_GROUP_NORM_ATTRIBUTES = {"weight", "bias", "num_groups", "num_channels", "eps", "affine", "training"}
_DYNAMIC = {"__dict__", "_modules", "children", "named_children", "modules", "named_modules", "apply", "_apply",
            "get_submodule", "__getattr__", "__getattribute__", "__setattr__"}
_SELF_ALLOWED_IN = {"type", "isinstance", "id", "super"}
_DECORATORS = {"property", "staticmethod", "classmethod", "setter", "getter", "deleter"}
_OPEN = object()  # a pure test whose value is not known
_IMPURE = object()  # a test whose evaluation may call code or read tensor values


class _Refuse(Exception):
    """The class's code cannot be checked; nothing of it is swapped."""


@functools.lru_cache(maxsize=None)
def _class_source(cls):
    """(ClassDef node, file name, first line, last line) of cls, or None when its source is not available."""
    try:
        lines, first = inspect.getsourcelines(cls)
        filename = os.path.realpath(inspect.getsourcefile(cls))
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.ClassDef):
        return None
    return tree.body[0], filename, first, first + len(lines) - 1


def _functions_of(value):
    """The plain functions behind a class attribute (a method, staticmethod, classmethod or property)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    return [value] if isinstance(value, types.FunctionType) else []


def _methods(cls):
    """[(FunctionDef, absolute line of its first line)] of cls, after checking that cls's functions are these."""
    source = _class_source(cls)
    if source is None:
        raise _Refuse(f"no source for {cls.__qualname__}")
    node, filename, first, last = source
    for value in vars(cls).values():
        for function in _functions_of(value):
            code = function.__code__
            if os.path.realpath(code.co_filename) != filename or not first <= code.co_firstlineno <= last:
                raise _Refuse(f"{cls.__qualname__}.{function.__name__} is not the code in its class's source")
    methods = []
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in statement.decorator_list:
                name = decorator.attr if isinstance(decorator, ast.Attribute) else getattr(decorator, "id", None)
                if name not in _DECORATORS:
                    raise _Refuse(f"{cls.__qualname__}.{statement.name} is decorated")
            methods.append((statement, first + statement.lineno - 1))
        elif any(isinstance(n, ast.Lambda) for n in ast.walk(statement)):
            raise _Refuse(f"{cls.__qualname__} has a lambda in its class body")
    return methods


def _self_name(function):
    if any(getattr(d, "id", None) in ("staticmethod", "classmethod") for d in function.decorator_list):
        return None
    positional = function.args.posonlyargs + function.args.args
    return positional[0].arg if positional else None


def _self_attribute(node, self_name, names):
    """The attribute name when node is `self.<name>` with name in names, else None."""
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self_name
            and node.attr in names):
        return node.attr
    return None


def _single_call(node, self_name, names):
    """The attribute name when node is `self.<name>(one positional argument)` with name in names, else None."""
    if (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
            and not isinstance(node.args[0], ast.Starred)):
        return _self_attribute(node.func, self_name, names)
    return None


FUNCTIONAL_SILU = "F.silu()"  # the act of a proven use whose SiLU is a function call (F.silu(v)), not an attribute


def _act_call(node, self_name, acts, functional):
    """The act when node is `self.<act>(one positional argument)` (act in acts), or FUNCTIONAL_SILU when it is
    `<f>(one positional argument)` with functional(f) true (a name chain that resolves to a SiLU function), else
    None."""
    act = _single_call(node, self_name, acts)
    if act is not None or functional is None:
        return act
    if (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
            and not isinstance(node.args[0], ast.Starred) and functional(node.func)):
        return FUNCTIONAL_SILU
    return None


def _bound_names(function):
    """Names that function binds itself (parameters, assignments, imports, loop and with targets...), or None when
    it declares any global or nonlocal (then no name of it can be resolved from the module's globals)."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return None
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not function:
            names.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _functional_resolver(function, module_globals, silu_functions):
    """functional(node) for _act_call: whether node is a name or a chain of attributes (`F.silu`,
    `torch.nn.functional.silu`) that the function does not bind itself and that resolves, through the module's
    globals and the modules they name (their __dict__, so no code runs), to one of silu_functions. None when there is
    nothing to resolve."""
    if not silu_functions or module_globals is None:
        return None
    bound = _bound_names(function)
    if bound is None:
        return None

    def functional(node):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id in bound or node.id not in module_globals:
            return False
        value = module_globals[node.id]
        for attr in reversed(chain):
            if not isinstance(value, types.ModuleType):
                return False
            value = vars(value).get(attr, UNKNOWN)
        return any(value is f for f in silu_functions)
    return functional


class _Tests:
    """Decides `if` tests from the block's plain attributes (three-valued, with purity)."""

    def __init__(self, self_name, lookup):
        self.self_name = self_name
        self.lookup = lookup

    def decide(self, test):
        """True or False when the test is pure and the configuration decides it, else None."""
        value = self._truth(test)
        return value if isinstance(value, bool) else None

    def _operand(self, node):
        """(True, value) when known, (False, _OPEN) when pure but unknown, (False, _IMPURE) otherwise."""
        if isinstance(node, ast.Constant):
            return True, node.value
        if isinstance(node, ast.Name):
            return False, _OPEN
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self.self_name:
            value = self.lookup(node.attr)
            return (False, _IMPURE) if value is UNKNOWN else (True, value)
        return False, _IMPURE

    def _truth(self, node):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            value = self._truth(node.operand)
            return (not value) if isinstance(value, bool) else value
        if isinstance(node, ast.BoolOp):
            parts = [self._truth(v) for v in node.values]
            if _IMPURE in parts:
                return _IMPURE
            decisive = isinstance(node.op, ast.Or)  # the value that ends the evaluation
            if decisive in parts:
                return decisive
            return (not decisive) if all(isinstance(p, bool) for p in parts) else _OPEN
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            (left_known, left), (right_known, right) = self._operand(node.left), self._operand(node.comparators[0])
            op = node.ops[0]
            if left is _IMPURE or right is _IMPURE:
                return _IMPURE
            if isinstance(op, (ast.Is, ast.IsNot)):  # identity: pure for any operands
                if left_known and right_known and (left is None or right is None):
                    return (left is right) == isinstance(op, ast.Is)
                return _OPEN
            if isinstance(op, (ast.Eq, ast.NotEq)) and left_known and right_known and \
                    type(left) in _PLAIN and type(right) in _PLAIN:
                return (left == right) == isinstance(op, ast.Eq)
            return _IMPURE
        known, value = self._operand(node)
        if known and type(value) in _PLAIN:
            return bool(value)
        return _IMPURE  # truth of a tensor, module or unknown value may run code


def _statement_bodies(statement):
    """The statement lists inside a compound statement other than `if` (loops, with, try, match)."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return  # a nested scope: its uses are found (and not proven) by the scan of all nodes
    for _, value in ast.iter_fields(statement):
        if isinstance(value, list):
            for item in value:
                if isinstance(item, ast.stmt):
                    yield value
                    break
                if hasattr(item, "body") and isinstance(item.body, list):  # except handlers, match cases
                    yield item.body


# Tensor methods that always return a view (never a copy; `view` raises rather than copy): a SiLU applied to a view of
# silu(group_norm(x)) is that view of silu(group_norm(x)), so the swapped SiLU may pass such a view through.
_VIEWS = {"permute", "unflatten", "transpose", "movedim", "unsqueeze", "squeeze", "view", "narrow", "swapaxes",
          "swapdims"}


def _pure_argument(node, self_name):
    """An argument whose evaluation runs no code: constants, local names, tuples/lists of them, arithmetic."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id != self_name
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_pure_argument(e, self_name) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _pure_argument(node.operand, self_name)
    if isinstance(node, ast.BinOp):
        return _pure_argument(node.left, self_name) and _pure_argument(node.right, self_name)
    return False


def _view_step(statement, variable, self_name):
    """Whether statement is `variable = variable.<view>(...).<view>(...)...` (methods of _VIEWS, pure arguments)."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id == variable):
        return False
    node, steps = statement.value, 0
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _VIEWS:
        if not all(_pure_argument(a, self_name) for a in node.args) or \
                not all(k.arg is not None and _pure_argument(k.value, self_name) for k in node.keywords):
            return False
        node, steps = node.func.value, steps + 1
    return steps > 0 and isinstance(node, ast.Name) and node.id == variable


def _consumer(statements, j, variable, self_name, convs, drops):
    """(conv, drops passed) when statements[j:] are `variable = self.<drop>(variable)` (drop in drops, any number)
    and then `w = self.<conv>(variable)` or `return self.<conv>(variable)` (conv in convs), else None."""
    passed = []
    while j < len(statements) and isinstance(statements[j], ast.Assign) and len(statements[j].targets) == 1 \
            and isinstance(statements[j].targets[0], ast.Name) and statements[j].targets[0].id == variable \
            and _single_call(statements[j].value, self_name, drops) \
            and isinstance(statements[j].value.args[0], ast.Name) and statements[j].value.args[0].id == variable:
        passed.append(statements[j].value.func.attr)
        j += 1
    if j >= len(statements):
        return None
    statement = statements[j]
    if isinstance(statement, ast.Assign):
        if len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Name):
            return None
    elif not isinstance(statement, ast.Return):
        return None
    conv = _single_call(statement.value, self_name, convs)
    argument = statement.value.args[0] if conv else None
    if isinstance(argument, ast.Name) and argument.id == variable:
        return conv, tuple(passed)
    return None


def _forward_pairs(function, self_name, norms, acts, tests, functional=None, convs=(), drops=()):
    """({id(norm Call): act} for `v = self.norm(e)` followed by `v = self.act(v)` (or `v = F.silu(v)`: the act
    FUNCTIONAL_SILU, where functional resolves the callee), ids of dead nodes, {id(norm Call): (conv, drops)} where
    the act's statement (a module act) is followed in its own statement list by `v = self.drop(v)` statements and
    then a call of self.conv on v (_consumer))."""
    proven, dead, followers = {}, set(), {}

    def live(statements):
        result = []
        for statement in statements:
            taken = tests.decide(statement.test) if isinstance(statement, ast.If) else None
            if taken is None:
                result.append(statement)
                continue
            kept, dropped = (statement.body, statement.orelse) if taken else (statement.orelse, statement.body)
            dead.update(id(n) for s in dropped for n in ast.walk(s))
            result.extend(live(kept))
        return result

    def act_of(statement, variable):
        """The act when statement is `variable = self.act(variable)` or `return self.act(variable)`."""
        if isinstance(statement, ast.Assign):
            if len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Name) or \
                    statement.targets[0].id != variable:
                return None
        elif not isinstance(statement, ast.Return):
            return None
        act = _act_call(statement.value, self_name, acts, functional)
        argument = statement.value.args[0] if act else None
        return act if isinstance(argument, ast.Name) and argument.id == variable else None

    def walk(statements, after):
        statements = live(statements)
        for i, statement in enumerate(statements):
            following = statements[i + 1] if i + 1 < len(statements) else after
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                    and isinstance(statement.targets[0], ast.Name):
                j = i + 1  # past `v = v.permute(...)` and the like: the act then gets a view of the norm's output
                while j < len(statements) and _view_step(statements[j], statement.targets[0].id, self_name):
                    j += 1
                following = statements[j] if j < len(statements) else after
            if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name)
                    and _single_call(statement.value, self_name, norms) and following is not None):
                act = act_of(following, statement.targets[0].id)
                if act:
                    proven[id(statement.value)] = act
                    at = next((k for k in range(i + 1, len(statements)) if statements[k] is following), None)
                    if act != FUNCTIONAL_SILU and at is not None and isinstance(following, ast.Assign) and convs:
                        consumer = _consumer(statements, at + 1, statement.targets[0].id, self_name, convs, drops)
                        if consumer is not None:
                            followers[id(statement.value)] = consumer
            if isinstance(statement, ast.If):
                walk(statement.body, following)
                walk(statement.orelse, following)
            else:
                for body in _statement_bodies(statement):
                    walk(body, None)  # loop bodies go back to their header, try bodies to handlers: unknown

    walk(function.body, None)
    return proven, dead, followers


def _scan(function, self_name, norms, acts, proven, dead, found, unproven, functional=None, followers=None,
          consumers=None):
    """Classifies every use of self.<norm> in function (a method, or code that __init__ leaves behind): found[norm]
    gets the acts of proven uses, unproven the rest; consumers[norm] (when given) the follower of each proven use
    (followers[id(call)], or None)."""
    followers = followers or {}
    consumers = {} if consumers is None else consumers
    where = getattr(function, "name", type(function).__name__.lower())
    parents = {}
    stack = [function]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if id(child) not in dead:
                parents[id(child)] = node
                stack.append(child)
        if node is function:
            continue
        parent = parents[id(node)]
        if isinstance(node, ast.Name) and node.id == self_name:
            if isinstance(parent, ast.Attribute) and parent.value is node:
                continue
            if isinstance(parent, ast.Call) and getattr(parent.func, "id", None) in _SELF_ALLOWED_IN:
                continue
            raise _Refuse(f"'{self_name}' is used as a value in {where}")
        if _self_attribute(node, self_name, _DYNAMIC):
            raise _Refuse(f"{where} reaches attributes dynamically ({node.attr})")
        if _self_attribute(node, self_name, acts) and not isinstance(node.ctx, ast.Load):
            raise _Refuse(f"{where} replaces or deletes self.{node.attr}")
        norm = _self_attribute(node, self_name, norms)
        if norm is None:
            continue
        if isinstance(parent, ast.Attribute) and parent.value is node and parent.attr in _GROUP_NORM_ATTRIBUTES:
            continue  # self.norm.weight and the like: the new module has the same attributes
        if not (isinstance(parent, ast.Call) and parent.func is node):
            unproven.add(norm)
            continue
        if id(parent) in proven:
            found.setdefault(norm, set()).add(proven[id(parent)])
            consumers.setdefault(norm, []).append(followers.get(id(parent)))
            continue
        outer = parents.get(id(parent))
        act = _act_call(outer, self_name, acts, functional) if _single_call(parent, self_name, norms) else None
        if act and outer.args[0] is parent:
            found.setdefault(norm, set()).add(act)
            consumers.setdefault(norm, []).append(None)
            continue
        arguments = parent.args + [k.value for k in parent.keywords]
        starred = any(isinstance(a, ast.Starred) for a in parent.args) or any(k.arg is None for k in parent.keywords)
        if not starred and len(arguments) != 1:
            continue  # GroupNorm and its replacement both take exactly one argument: a TypeError either way
        unproven.add(norm)


_LATER = (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.GeneratorExp)  # code that runs later


def _scan_left_behind(init, self_name, norms, acts, found, unproven, functional=None):
    """__init__ runs before any swap and is not examined itself; the code it writes to run later (functions, lambdas,
    classes, generator expressions: `self.helper = lambda x: self.norm(x)`) is scanned as a method is. Where there
    is such code, `self` may not be used as a value anywhere in __init__: an alias would reach the norm unseen."""
    later, stack = [], list(ast.iter_child_nodes(init))
    while stack:
        node = stack.pop()
        if isinstance(node, _LATER):
            later.append(node)  # its own nested code is scanned with it
        else:
            stack.extend(ast.iter_child_nodes(node))
    if not later:
        return
    for parent in ast.walk(init):
        for child in ast.iter_child_nodes(parent):
            if not (isinstance(child, ast.Name) and child.id == self_name):
                continue
            if isinstance(parent, ast.Attribute) and parent.value is child:
                continue
            if isinstance(parent, ast.Call) and getattr(parent.func, "id", None) in _SELF_ALLOWED_IN:
                continue
            raise _Refuse(f"'{self_name}' is used as a value in an __init__ that leaves code behind")
    for node in later:
        _scan(node, self_name, norms, acts, {}, set(), found, unproven, functional)


def proven_pairs(cls, base, norms, acts, lookup, silu_functions=()):
    """{norm: set of acts}: proven_chains without the convolutions."""
    return {norm: chain[0] for norm, chain in proven_chains(cls, base, norms, acts, lookup, silu_functions).items()}


def proven_chains(cls, base, norms, acts, lookup, silu_functions=(), convs=(), drops=()):
    """{norm: set of acts} for the attributes in `norms` whose every use in cls's code is proven (module docstring).

    cls: the block's class; base: the first class of cls's MRO not examined (torch.nn.Module); norms and acts:
    names of the block's attributes holding a plain GroupNorm or SiLU module; lookup(name): the block's value of
    a plain instance attribute (used to decide `if` tests in forward), or UNKNOWN; silu_functions: functions
    (torch.nn.functional.silu) whose calls count as a SiLU too, the act FUNCTIONAL_SILU, when the callee is a name
    chain that the method does not bind and that resolves through its module's globals to one of them.

    Returns {norm: (set of acts, follower)}. follower is (conv, drops) when every proven use of the norm is
    `v = self.norm(e)` / `v = self.act(v)` (a module act) in forward, followed in the same statement list by
    `v = self.<drop>(v)` statements (drop in `drops`: attributes that return their input itself) and then
    `w = self.<conv>(v)` or `return self.<conv>(v)`, with one conv for all uses (conv in `convs`); else None.
    """
    mro = cls.__mro__
    if base not in mro:
        return {}
    classes = mro[:mro.index(base)]
    owner = next((k for k in classes if "forward" in vars(k)), None)
    if owner is None:
        return {}
    forward = vars(owner)["forward"]
    if not isinstance(forward, types.FunctionType):
        return {}
    found, unproven, consumers, replaced = {}, set(), {}, set()
    try:
        for k in classes:
            module = sys.modules.get(k.__module__)
            module_globals = vars(module) if module is not None else None
            for function, line in _methods(k):
                self_name = _self_name(function)
                if self_name is None:
                    continue
                functional = _functional_resolver(function, module_globals, silu_functions)
                if function.name != "__init__":  # a method replacing a conv or drop: no follower through it
                    for node in ast.walk(function) if convs else ():
                        name = _self_attribute(node, self_name, set(convs) | set(drops))
                        if name is not None and not isinstance(node.ctx, ast.Load):
                            replaced.add(name)
                if function.name == "__init__":
                    _scan_left_behind(function, self_name, norms, acts, found, unproven, functional)
                    continue
                proven, dead, followers = {}, set(), {}
                if k is owner and function.name == "forward" and line == forward.__code__.co_firstlineno:
                    proven, dead, followers = _forward_pairs(function, self_name, norms, acts,
                                                             _Tests(self_name, lookup), functional, convs, drops)
                _scan(function, self_name, norms, acts, proven, dead, found, unproven, functional, followers,
                      consumers)
    except _Refuse:
        return {}
    chains = {}
    for norm in sorted(found):
        if norm in unproven:
            continue
        uses = consumers.get(norm, [])
        follower = uses[0] if uses and all(u == uses[0] for u in uses) else None
        if follower is not None and replaced & {follower[0], *follower[1]}:
            follower = None
        chains[norm] = (found[norm], follower)
    return chains


def padded_convolution(cls, pad_functions):
    """(pad attribute, mode attribute, conv attribute) when cls (a module class) is proven to compute
    `conv(F.pad(x, self.<pad>, mode=self.<mode>))` and nothing else: its forward (defined in cls itself, cls's MRO
    up to nn.Module holding no other forward) is exactly `v = <f>(v, self.<pad>, mode=self.<mode>)` then
    `return self.<conv>(v)`, where <f> is a name chain that resolves through the module's globals to one of
    pad_functions (torch.nn.functional.pad), with v its one parameter besides self. Else None."""
    forward = vars(cls).get("forward")
    if not isinstance(forward, types.FunctionType):
        return None
    try:
        methods = _methods(cls)
    except _Refuse:
        return None
    node = next((f for f, _ in methods if f.name == "forward"), None)
    module = sys.modules.get(cls.__module__)
    if node is None or module is None or node.decorator_list:
        return None
    arguments = node.args
    if arguments.posonlyargs or arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.defaults \
            or len(arguments.args) != 2:
        return None
    self_name, variable = arguments.args[0].arg, arguments.args[1].arg
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 2 or not isinstance(body[0], ast.Assign) or not isinstance(body[1], ast.Return):
        return None
    assign = body[0]
    if len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name) or assign.targets[0].id != variable:
        return None
    call = assign.value
    resolves = _functional_resolver(node, vars(module), pad_functions)
    if not (isinstance(call, ast.Call) and resolves is not None and resolves(call.func) and len(call.args) == 2
            and isinstance(call.args[0], ast.Name) and call.args[0].id == variable
            and len(call.keywords) == 1 and call.keywords[0].arg == "mode"):
        return None
    pad = _self_attribute(call.args[1], self_name, {call.args[1].attr} if isinstance(call.args[1], ast.Attribute)
                          else set())
    mode_node = call.keywords[0].value
    mode = _self_attribute(mode_node, self_name, {mode_node.attr} if isinstance(mode_node, ast.Attribute) else set())
    returned = body[1].value
    if pad is None or mode is None or not isinstance(returned, ast.Call) or len(returned.args) != 1 \
            or not isinstance(returned.args[0], ast.Name) or returned.args[0].id != variable:
        return None
    conv = _single_call(returned, self_name, {returned.func.attr} if isinstance(returned.func, ast.Attribute)
                        else set())
    return (pad, mode, conv) if conv is not None else None


# ---- a convolution's bias handed to the GroupNorm after it ---------------------------------------------------------
def _none_test(test, parameters):
    """(p, value of the test whenever p is None) when test is `p is not None` or `p is not None and ...` (False,
    without evaluating the rest), or `p is None` or `p is None or ...` (True, likewise), with p one of `parameters`;
    else None."""
    first = test.values[0] if isinstance(test, ast.BoolOp) else test
    if (isinstance(first, ast.Compare) and len(first.ops) == 1 and isinstance(first.ops[0], (ast.Is, ast.IsNot))
            and isinstance(first.left, ast.Name) and first.left.id in parameters
            and isinstance(first.comparators[0], ast.Constant) and first.comparators[0].value is None):
        value = isinstance(first.ops[0], ast.Is)
        if first is test or isinstance(test.op, ast.Or) == value:  # `and` after False, `or` after True: decided
            return first.left.id, value
    return None


def _rebinds(node, names):
    """Whether node binds or deletes one of `names` (an assignment, loop or with target, walrus, del, import,
    except ... as, a match capture, or a global/nonlocal declaration of it)."""
    if isinstance(node, ast.Name):
        return node.id in names and not isinstance(node.ctx, ast.Load)
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return bool(names & set(node.names))
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name).split(".")[0] in names for a in node.names)
    if isinstance(node, ast.ExceptHandler):
        return node.name in names
    if type(node).__name__ in ("MatchAs", "MatchStar", "MatchMapping"):
        return any(getattr(node, field, None) in names for field in ("name", "rest"))
    return False


def _bias_uses(function, self_name, convs, norms, tests):
    """({id(conv Call): (norm, parameters)}, ids of dead nodes) for forward: each `v = self.<conv>(e)` whose next
    statement (following the control flow as _forward_pairs does, decided `if`s pruned) is, while every one of
    `parameters` is None, `v = self.<norm>(v)`. Between them only `if` statements whose test that decides
    (_none_test: `if p is not None:`, `if p is None:`, with p a parameter of forward that forward's live code never
    rebinds): the flow goes on into the branch taken when p is None, or past the `if` where that branch is empty
    (diffusers' `if temb is not None: hidden_states = hidden_states + temb`; KVAE's `if zq is None: h =
    self.norm2(h) else: ...`)."""
    arguments = function.args
    parameters = {a.arg for a in arguments.posonlyargs + arguments.args[1:] + arguments.kwonlyargs}
    candidates, dead = {}, set()

    def live(statements):
        result = []
        for statement in statements:
            taken = tests.decide(statement.test) if isinstance(statement, ast.If) else None
            if taken is None:
                result.append(statement)
                continue
            kept, dropped = (statement.body, statement.orelse) if taken else (statement.orelse, statement.body)
            dead.update(id(n) for s in dropped for n in ast.walk(s))
            result.extend(live(kept))
        return result

    def follow(tail, variable, guards):
        for k, statement in enumerate(tail):
            if statement is None:  # where the flow goes next is not known (a loop or try body ends)
                return None
            decided = _none_test(statement.test, parameters) if isinstance(statement, ast.If) else None
            if decided is not None:
                parameter, value = decided
                taken = live(statement.body if value else statement.orelse)
                return follow(taken + tail[k + 1:], variable, guards | {parameter})
            if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id == variable):
                norm = _single_call(statement.value, self_name, norms)
                argument = statement.value.args[0] if norm else None
                if isinstance(argument, ast.Name) and argument.id == variable:
                    return norm, tuple(sorted(guards))
            return None
        return None

    def walk(statements, rest):
        statements = live(statements)
        for i, statement in enumerate(statements):
            tail = statements[i + 1:] + rest
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                    and isinstance(statement.targets[0], ast.Name) and _single_call(statement.value, self_name, convs):
                found = follow(tail, statement.targets[0].id, frozenset())
                if found is not None:
                    candidates[id(statement.value)] = found
            if isinstance(statement, ast.If):
                walk(statement.body, tail)
                walk(statement.orelse, tail)
            else:
                for body in _statement_bodies(statement):
                    walk(body, [None])  # loop bodies go back to their header, try bodies to handlers: unknown

    walk(function.body, [])
    rebound = set()
    for node in ast.walk(function):
        if id(node) not in dead:
            rebound.update(p for p in parameters if _rebinds(node, {p}))
    proven = {call: found for call, found in candidates.items() if not rebound & set(found[1])}
    return proven, dead


def proven_bias_moves(cls, base, convs, norms, lookup):
    """{conv: (norm, parameters)} for the attributes in `convs` (a block's plain convolutions with a bias) whose
    every use in cls's code (up to `base`, as proven_chains reads it) is `v = self.<conv>(e)` in forward followed,
    while each of `parameters` (names of forward's parameters) is None at run time, by `v = self.<norm>(v)`
    (_bias_uses), with one norm for all of a conv's uses, a norm in `norms` that no method but __init__ assigns or
    deletes. The convolution's output then goes to that norm and nowhere else, so the norm may add the conv's bias
    itself (gnsilu's input_bias) when the conv leaves it out. Harmless uses of the conv otherwise are reads of
    `self.conv.weight`, `.bias` and the like and calls with other than one argument (a TypeError either way); code
    that __init__ leaves behind is examined as for the pairs. lookup decides `if` tests as for proven_chains."""
    mro = cls.__mro__
    if base not in mro or not convs or not norms:
        return {}
    classes = mro[:mro.index(base)]
    owner = next((k for k in classes if "forward" in vars(k)), None)
    if owner is None:
        return {}
    forward = vars(owner)["forward"]
    if not isinstance(forward, types.FunctionType):
        return {}
    convs, norms = set(convs), set(norms)
    found, unproven, replaced = {}, set(), set()
    try:
        for k in classes:
            for function, line in _methods(k):
                self_name = _self_name(function)
                if self_name is None:
                    continue
                if function.name == "__init__":
                    _scan_left_behind(function, self_name, convs, set(), found, unproven)
                    continue
                for node in ast.walk(function):  # a method replacing a norm: the conv would hand to the old one
                    name = _self_attribute(node, self_name, norms)
                    if name is not None and not isinstance(node.ctx, ast.Load):
                        replaced.add(name)
                proven, dead = {}, set()
                if k is owner and function.name == "forward" and line == forward.__code__.co_firstlineno:
                    proven, dead = _bias_uses(function, self_name, convs, norms, _Tests(self_name, lookup))
                _scan(function, self_name, convs, set(), proven, dead, found, unproven)
    except _Refuse:
        return {}
    moves = {}
    for conv in sorted(found):
        targets = found[conv]
        if conv in unproven or len({norm for norm, _ in targets}) != 1:
            continue
        norm = next(iter(targets))[0]
        if norm not in replaced:
            moves[conv] = (norm, tuple(sorted({p for _, parameters in targets for p in parameters})))
    return moves

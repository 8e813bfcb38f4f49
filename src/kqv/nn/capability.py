"""Fast paths chosen by what a module keeps, not by its exact type.

A fast path (the closed-form blockwise biases, the lean decoding step) computes what some methods of a known class
compute, without calling them. It may take any instance of that class whose class keeps those methods as they
are: a subclass that only changes a parameter (an ALiBi scheme with other slopes) takes it; one that overrides a
method the fast path relies on takes the general path, which calls the method.
"""

from __future__ import annotations


def keeps(obj: object, base: type, *methods: str) -> bool:
    """Whether `obj` is a `base` whose `methods` are `base`'s own (none overridden by its class)."""
    return isinstance(obj, base) and all(getattr(type(obj), name) is getattr(base, name) for name in methods)

"""A small LRU cache keyed by the identity of objects, held by weak reference.

The caches of odeint's systems and configured methods (``_odeint``) and of compiled kernels
(``_compile``) are keyed by *which* function, integrator or system a call passed, not by its value.
A bare ``id()`` key can outlive its object, and CPython hands a freed object's id to the next one,
so a new function could find the entry of a dead one.  Here every entry holds a weak reference to
each key object, whose callback drops the entry when that object is collected (before its id can be
reused), and a lookup checks identity as well.  An object that takes no weak reference is held
strongly instead (its id then cannot be recycled while the entry lives).  Values may reference
their keys (a compiled system holds its func): the size bound is what frees those.
"""
from __future__ import annotations

import collections
import threading
import weakref


def _ref(obj, callback):
    try:
        return weakref.ref(obj, callback)
    except TypeError:          # no weak reference (None, ints, __slots__ classes): hold it
        return lambda: obj


class IdentityCache:
    """``get(objs, extra)`` / ``put(objs, extra, value)``: ``objs`` a tuple of objects matched by
    identity, ``extra`` a hashable rest of the key matched by value; at most ``size`` entries,
    least recently used dropped first."""

    def __init__(self, size: int):
        self.size = size
        self._entries: collections.OrderedDict = collections.OrderedDict()
        # reentrant: dropping an entry can free an object whose callback drops another
        self._lock = threading.RLock()

    def __len__(self):
        return len(self._entries)

    def get(self, objs: tuple, extra=()):
        key = (tuple(id(o) for o in objs), extra)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            refs, value = entry
            if not all(r() is o for r, o in zip(refs, objs)):   # belt and braces: never stale
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return value

    def put(self, objs: tuple, extra, value):
        key = (tuple(id(o) for o in objs), extra)

        def drop(ref, key=key):
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and any(r is ref for r in entry[0]):
                    del self._entries[key]

        refs = tuple(_ref(o, drop) for o in objs)
        with self._lock:
            self._entries[key] = (refs, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value

    def clear(self):
        with self._lock:
            self._entries.clear()

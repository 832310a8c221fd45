"""One exception tree (tracemq.errors): every public exception class of the library, the
services and the Spark job derives from its package's root, and each root from TracemqError.

The modules are walked, not listed, so an exception added later anywhere is checked too."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import pytest
from tracemq import errors
from tracemq.errors import TracemqError

#: package -> (module of its root, name of its root)
ROOTS = {
    "tracemq": ("tracemq.errors", "TracemqError"),
    "tracemq_broker": ("tracemq_broker.errors", "BrokerError"),
    "tracemq_collector": ("tracemq_collector.errors", "CollectorError"),
    "tracemq_nameserver": ("tracemq_nameserver.errors", "NameserverError"),
    "tracemq_spark": ("tracemq_spark.params", "ReconcileError"),
}


def _modules(package: str) -> list[ModuleType]:
    root = importlib.import_module(package)
    found = [root]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":  # running it is its only purpose
            continue
        found.append(importlib.import_module(info.name))
    return found


def _public_exceptions(package: str) -> list[type[BaseException]]:
    out = []
    for module in _modules(package):
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__  # defined here, not imported
                and not name.startswith("_")
            ):
                out.append(obj)
    return out


@pytest.mark.parametrize("package", sorted(ROOTS))
def test_every_public_exception_derives_from_its_package_root(package: str) -> None:
    module, name = ROOTS[package]
    root = getattr(importlib.import_module(module), name)
    assert issubclass(root, TracemqError)
    found = _public_exceptions(package)
    assert root in found
    strays = sorted(f"{c.__module__}.{c.__qualname__}" for c in found if not issubclass(c, root))
    assert not strays, f"exceptions outside {name}: {strays}"


def test_the_library_defines_its_exceptions_in_errors_and_documents_each() -> None:
    found = _public_exceptions("tracemq")
    # the command line (its exit-code classes) is a tool over the library
    elsewhere = sorted(
        f"{c.__module__}.{c.__qualname__}"
        for c in found
        if c.__module__ != "tracemq.errors" and not c.__module__.startswith("tracemq.cli.")
    )
    assert not elsewhere, f"define these in tracemq.errors: {elsewhere}"
    doc = errors.__doc__ or ""
    missing = [
        c.__name__
        for c in found
        if c.__module__ == "tracemq.errors" and not re.search(rf"\b{c.__name__}\b", doc)
    ]
    assert not missing, f"not in the tree of tracemq.errors' docstring: {missing}"


def test_old_builtin_bases_and_import_paths_are_kept() -> None:
    from tracemq.producer import BatchSendError, SendError
    from tracemq.protocol._envelope import ProtocolError
    from tracemq.protocol.recall import RecallHandleError
    from tracemq.protocol.signing import SignatureError
    from tracemq.service import ServiceTaskEnded
    from tracemq.trace import DecodeError, TraceTopicError

    assert (SendError, BatchSendError) == (errors.SendError, errors.BatchSendError)
    assert TraceTopicError is errors.TraceTopicError
    for cls in (ProtocolError, SignatureError, RecallHandleError, DecodeError):
        assert issubclass(cls, ValueError) and issubclass(cls, TracemqError)
    assert issubclass(ServiceTaskEnded, RuntimeError)
    from tracemq_collector.groups import UnknownGroup
    from tracemq_collector.queries import BadCursor

    assert issubclass(UnknownGroup, LookupError) and issubclass(BadCursor, ValueError)

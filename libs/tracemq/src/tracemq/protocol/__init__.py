"""Wire schemas of tracemq's own Kafka topics (control and admin), msgpack-encoded, versioned.

Every ``decode*`` raises only :class:`ProtocolError` (a :class:`~tracemq.errors.TracemqError`
and a ``ValueError``) whatever the input; :func:`show` is the bounded ``repr`` a service quotes
an offending value with.
"""

from tracemq.errors import ProtocolError
from tracemq.protocol._envelope import SCHEMA_VERSION, show

__all__ = ["SCHEMA_VERSION", "ProtocolError", "show"]

"""The msgId as the classification's grouping and join key: fixed width where it can be.

Every hash aggregation and shuffled hash join of the classification is keyed by the msgId.
As a 32-character string it makes each key a variable-length field of the rows hashed,
compared and shuffled (JFR's top frame at 10M messages was ``ByteArrayMethods.arrayEquals``, the
key compares). A RocketMQ msgId is 16 bytes written as 32 uppercase hex digits, so it travels
as two longs (:data:`KEY`: ``id_hi``, ``id_lo``) and an empty ``id_str``. Any other id (lower
or mixed case, another length, not hex, the ``\\u0000``-prefixed keys of consumes without a
msgId) keeps its string in ``id_str``, with both longs 0.

Exact both ways, no hash: an uppercase 32-hex id and its two longs are one-to-one, a non-empty
``id_str`` never meets an empty one, and :func:`msg_id_of` gives back the very string (hex
digits are decoded uppercase, which is why only uppercase ids take the fixed path: a lowercase
id would come back changed).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

#: the key columns, in the order every repartition, aggregation and join uses them
KEY = ["id_hi", "id_lo", "id_str"]


def _is_fixed(msg_id: Column) -> Column:
    """32 uppercase hex digits (false for null). Cheaper than a regex per row: the byte
    length first, then ``unhex`` (null on a non-hex digit) and ``upper`` (an ASCII loop)."""
    return F.coalesce(
        (F.octet_length(msg_id) == 32) & F.unhex(msg_id).isNotNull() & (F.upper(msg_id) == msg_id),
        F.lit(False),
    )


def _half(msg_id: Column, start: int) -> Column:
    # base -10: the 16 digits read as a signed 64-bit two's complement, so all fit a long
    return F.conv(F.substring(msg_id, start, 16), 16, -10).cast("long")


def key_columns(msg_id: Column, prefix: str = "") -> list[Column]:
    """The :data:`KEY` columns of a msgId string column (named ``prefix`` + the key names);
    ``msg_id`` must not be null."""
    fixed = _is_fixed(msg_id)
    hi, lo, s = (prefix + k for k in KEY)
    return [
        F.when(fixed, _half(msg_id, 1)).otherwise(F.lit(0)).cast("long").alias(hi),
        F.when(fixed, _half(msg_id, 17)).otherwise(F.lit(0)).cast("long").alias(lo),
        F.when(fixed, F.lit("")).otherwise(msg_id).alias(s),
    ]


def msg_id_of(prefix: str = "") -> Column:
    """The msgId string of the :data:`KEY` columns (named ``prefix`` + the key names), exactly
    as it was read."""
    hi, lo, s = (F.col(prefix + k) for k in KEY)
    digits = F.concat(F.lpad(F.hex(hi), 16, "0"), F.lpad(F.hex(lo), 16, "0"))
    return F.when(s == "", digits).otherwise(s)


def key_equal(left: str, right: str) -> Column:
    """Join condition: the :data:`KEY` columns prefixed ``left`` equal those prefixed ``right``."""
    cond = F.lit(True)
    for k in KEY:
        cond = cond & (F.col(left + k) == F.col(right + k))
    return cond

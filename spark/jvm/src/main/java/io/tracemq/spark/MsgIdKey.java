package io.tracemq.spark;

import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The co-group's sort key: the time field of a RocketMQ msgId — milliseconds since the start of
 * its month, the 8 hex digits before the 4-digit counter — above the low 24 bits of the msgId's
 * hash {@code k}, so that a task's msgIds (and the classified rows it writes) come in roughly the
 * order they were created, as the lake's are, instead of in hash order. Any other msgId gets its
 * hash. Any function of the msgId would do: a msgId's rows stay one run of equal keys, and a run
 * holding two msgIds is split by msgId ({@code Task.Groups}).
 *
 * <p>{@link #of} is computed by the co-group's task as it sorts its rows (on the reduce side, from
 * the row's bytes); as a Java UDF (registered by {@code tracemq_spark.cogroup.sort_key}) the same
 * function on the map side cost a String and two boxed longs per row (~3 s of task CPU at 10M
 * messages), and Spark's {@code conv} on the hex digits ~0.6 µs a row.
 */
public final class MsgIdKey implements UDF2<String, Long, Long> {
  private static final long serialVersionUID = 1L;

  @Override
  public Long call(String pkey, Long k) {
    long h = k == null ? 0L : k;
    return pkey == null ? h : of(UTF8String.fromString(pkey), h);
  }

  /** The key of msgId {@code pkey} (its UTF-8 bytes) whose hash is {@code h}. */
  static long of(UTF8String pkey, long h) {
    return of(pkey.getBaseObject(), pkey.getBaseOffset(), pkey.numBytes(), h);
  }

  /**
   * The key of the msgId whose UTF-8 bytes are the {@code n} at {@code base}/{@code off} (as an
   * {@code UnsafeRow} holds them: no {@code UTF8String} made) and whose hash is {@code h}.
   */
  static long of(Object base, long off, int n, long h) {
    if (n != 32 && n != 56) {
      return h;
    }
    long t = 0;
    for (int i = n - 12; i < n - 4; i++) {
      int c = Platform.getByte(base, off + i);
      int d =
          c >= '0' && c <= '9'
              ? c - '0'
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) {
        return h;
      }
      t = (t << 4) | d;
    }
    return (t << 24) | (h & 0xFFFFFFL);
  }
}

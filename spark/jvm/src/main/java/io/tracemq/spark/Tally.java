package io.tracemq.spark;

import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Objects;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.AccumulatorV2;

/**
 * {@code tracemq_spark.latency.tally} of the classified rows, counted by the co-group's tasks
 * as they emit the rows (issue 19 goal 4): the tally's own stage read the 16M rows back and
 * exploded them into ~80M items of a hash aggregation keyed by strings (~20 s of task CPU at
 * 10M messages). Here each task's copy of this accumulator counts into arrays indexed by
 * outcome code and bucket (no allocation per row), sent back sparse (only the non-empty
 * buckets: Java's serialization of a map of boxed cells was a few per cent of the job's task
 * CPU); the driver gets the merged counts ({@link #frame}) after the write, the same rows
 * (keys, kind, b, n, vmax, w) as the Spark tally of the same rows, in other multiplicities
 * only where the Python side adds its own part (the sums downstream do not mind).
 *
 * <p>With a tally and without keepClassified, the co-group emits no CONSUMED row (five in
 * six of the classified rows): the tally was all that read them, and their Parquet write and
 * the later scans past them go with it.
 *
 * <p>Only rows whose outcome is neither null nor ORPHAN_CONSUME are counted here: orphans are
 * still filtered (their msgId's creation) and folded (empty msgIds) after the co-group, so
 * Spark tallies them. An accumulator of a result stage's tasks counts each partition once
 * (Spark merges a task's update only for the first successful attempt of its partition).
 */
public final class Tally extends AccumulatorV2<Tally, Tally> {
  private static final long serialVersionUID = 1L;

  /** the metrics' names (the tally's kinds), in the order {@link #count} takes them */
  final String[] metrics;
  /** a latency above this is a clock-skew suspect (latency.SKEW_LIMIT_MS) */
  final long skewLimit;
  /** latency.bucket's buckets as array indexes: 2 skew keys, 256 exact, 128 per power of 2 */
  final int nBuckets;

  /** per (window_start_ms, topic_h, group_h) */
  private HashMap<LongKey, Counts> groups = new HashMap<>();
  /** the group of the last row counted (rows come in runs of one group) */
  private transient Counts last;

  public Tally(String[] metrics, long skewLimit) {
    this.metrics = metrics.clone();
    this.skewLimit = skewLimit;
    nBuckets = 2 + 256 + 128 * Math.max(0, 64 - Long.numberOfLeadingZeros(skewLimit) - 8);
  }

  /** One group's counts: per outcome code; per metric and bucket, count and largest value. */
  static final class Counts implements Serializable {
    private static final long serialVersionUID = 1L;
    final Long window, topic, group;
    long[] outcomes = new long[Cogroup.OUTCOMES.length];
    /** per metric: bucket i's count at 2i and largest value at 2i + 1 (one cache line) */
    transient long[][] cells;

    Counts(Long window, Long topic, Long group, int nMetrics) {
      this.window = window;
      this.topic = topic;
      this.group = group;
      cells = new long[nMetrics][];
    }

    void add(Counts o, int nBuckets) {
      for (int i = 0; i < outcomes.length; i++) {
        outcomes[i] += o.outcomes[i];
      }
      for (int m = 0; m < cells.length; m++) {
        long[] oc = o.cells[m];
        if (oc == null) {
          continue;
        }
        if (cells[m] == null) {
          cells[m] = new long[2 * nBuckets];
        }
        long[] c = cells[m];
        for (int i = 0; i < 2 * nBuckets; i += 2) {
          if (oc[i] > 0) {
            if (c[i] == 0 || oc[i + 1] > c[i + 1]) {
              c[i + 1] = oc[i + 1];
            }
            c[i] += oc[i];
          }
        }
      }
    }

    /** sparse: per metric, the non-empty buckets' (index, count, largest value) */
    private void writeObject(ObjectOutputStream out) throws IOException {
      out.defaultWriteObject();
      out.writeInt(cells.length);
      for (long[] c : cells) {
        if (c == null) {
          out.writeInt(-1);
          continue;
        }
        out.writeInt(c.length);
        int k = 0;
        for (int i = 0; i < c.length; i += 2) {
          k += c[i] > 0 ? 1 : 0;
        }
        out.writeInt(k);
        for (int i = 0; i < c.length; i += 2) {
          if (c[i] > 0) {
            out.writeInt(i);
            out.writeLong(c[i]);
            out.writeLong(c[i + 1]);
          }
        }
      }
    }

    private void readObject(ObjectInputStream in) throws IOException, ClassNotFoundException {
      in.defaultReadObject();
      int metrics = in.readInt();
      cells = new long[metrics][];
      for (int m = 0; m < metrics; m++) {
        int size = in.readInt();
        if (size < 0) {
          continue;
        }
        long[] c = cells[m] = new long[size];
        int k = in.readInt();
        for (int j = 0; j < k; j++) {
          int i = in.readInt();
          c[i] = in.readLong();
          c[i + 1] = in.readLong();
        }
      }
    }
  }

  @Override
  public boolean isZero() {
    return groups.isEmpty();
  }

  @Override
  public Tally copy() {
    Tally t = new Tally(metrics, skewLimit);
    t.merge(this);
    return t;
  }

  @Override
  public void reset() {
    groups = new HashMap<>();
    last = null;
  }

  @Override
  public void add(Tally v) {
    merge(v);
  }

  @Override
  public void merge(AccumulatorV2<Tally, Tally> other) {
    for (Counts c : ((Tally) other).groups.values()) {
      groupOf(c.window, c.topic, c.group).add(c, nBuckets);
    }
  }

  @Override
  public Tally value() {
    return this;
  }

  private Counts groupOf(Long window, Long topic, Long group) {
    LongKey key = new LongKey(window, topic, group);
    Counts g = groups.get(key);
    if (g == null) {
      g = new Counts(window, topic, group, metrics.length);
      groups.put(key, g);
    }
    return g;
  }

  /** One classified row: its keys, outcome code and metric values (nulls not counted). */
  void count(Long window, Long topic, Long group, int outcome, Long[] values) {
    Counts g = last;
    if (g == null
        || !Objects.equals(g.window, window)
        || !Objects.equals(g.topic, topic)
        || !Objects.equals(g.group, group)) {
      g = groupOf(window, topic, group);
      last = g;
    }
    g.outcomes[outcome]++;
    for (int m = 0; m < values.length; m++) {
      Long x = values[m];
      if (x == null) {
        continue;
      }
      long v = x;
      if (v < 0 && v >= -1) { // latency.within_granularity
        v = 0;
      }
      int i = 2 * index(v);
      long[] c = g.cells[m];
      if (c == null) {
        c = g.cells[m] = new long[2 * nBuckets];
      }
      if (c[i]++ == 0 || v > c[i + 1]) {
        c[i + 1] = v;
      }
    }
  }

  /** latency.bucket's bucket of ``v`` as an array index. */
  int index(long v) {
    if (v < 0) {
      return 0;
    }
    if (v > skewLimit) {
      return 1;
    }
    if (v < 256) {
      return 2 + (int) v;
    }
    int shift = 64 - Long.numberOfLeadingZeros(v) - 8;
    return 2 + 256 + 128 * (shift - 1) + (int) ((v >>> shift) - 128);
  }

  /** The counts as a DataFrame: window_start_ms, topic_h, group_h, kind, b, n, vmax, w. */
  public Dataset<Row> frame(SparkSession spark) {
    List<Row> rows = new ArrayList<>();
    for (Counts g : groups.values()) {
      for (int o = 0; o < g.outcomes.length; o++) {
        if (g.outcomes[o] > 0) {
          rows.add(row(g, Cogroup.OUTCOMES[o], 0L, g.outcomes[o], null, 1L));
        }
      }
      for (int m = 0; m < metrics.length; m++) {
        long[] c = g.cells[m];
        if (c == null) {
          continue;
        }
        for (int i = 0; i < nBuckets; i++) {
          long n = c[2 * i];
          if (n == 0) {
            continue;
          }
          long b, w;
          if (i < 2) {
            b = i == 0 ? -1 : -2; // latency.SKEW_NEGATIVE, SKEW_ABSURD
            w = 1;
          } else if (i < 258) {
            b = i - 2;
            w = 1;
          } else {
            int j = i - 258;
            int shift = j / 128 + 1;
            b = (128L + j % 128) << shift;
            w = 1L << shift;
          }
          rows.add(row(g, metrics[m], b, n, c[2 * i + 1], w));
        }
      }
    }
    StructType schema =
        new StructType()
            .add("window_start_ms", DataTypes.LongType)
            .add("topic_h", DataTypes.LongType)
            .add("group_h", DataTypes.LongType)
            .add("kind", DataTypes.StringType)
            .add("b", DataTypes.LongType)
            .add("n", DataTypes.LongType, false)
            .add("vmax", DataTypes.LongType)
            .add("w", DataTypes.LongType);
    return spark.createDataFrame(rows, schema);
  }

  private static Row row(Counts g, String kind, long b, long n, Long vmax, long w) {
    return RowFactory.create(g.window, g.topic, g.group, kind, b, n, vmax, w);
  }
}

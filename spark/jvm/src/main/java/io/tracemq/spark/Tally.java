package io.tracemq.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
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
 * 10M messages). Here each task counts into arrays indexed by outcome code and bucket, and
 * hands the non-empty cells to this accumulator when its partition is done; the driver gets
 * the merged cells ({@link #frame}) after the write, the same rows (keys, kind, b, n, vmax,
 * w) as the Spark tally of the same rows, in other multiplicities only where the Python side
 * adds its own part (the sums downstream do not mind).
 *
 * <p>Only rows whose outcome is neither null nor ORPHAN_CONSUME are counted here: orphans are
 * still filtered (their msgId's creation) and folded (empty msgIds) after the co-group, so
 * Spark tallies them. An accumulator of a result stage's tasks counts each partition once
 * (Spark merges a task's update only for the first successful attempt of its partition).
 */
public final class Tally extends AccumulatorV2<Map<Tally.Key, Tally.Cell>, Map<Tally.Key, Tally.Cell>> {
  private static final long serialVersionUID = 1L;

  /** A tally row's key: (window_start_ms, topic_h, group_h, kind, b). */
  public static final class Key implements Serializable {
    private static final long serialVersionUID = 1L;
    final Long window, topic, group;
    final String kind;
    final long b;

    Key(Long window, Long topic, Long group, String kind, long b) {
      this.window = window;
      this.topic = topic;
      this.group = group;
      this.kind = kind;
      this.b = b;
    }

    @Override
    public boolean equals(Object o) {
      if (!(o instanceof Key)) {
        return false;
      }
      Key k = (Key) o;
      return b == k.b
          && Objects.equals(window, k.window)
          && Objects.equals(topic, k.topic)
          && Objects.equals(group, k.group)
          && kind.equals(k.kind);
    }

    @Override
    public int hashCode() {
      return Objects.hash(window, topic, group, kind, b);
    }
  }

  /** A tally row's values: count, largest value (null for an outcome), bucket width. */
  public static final class Cell implements Serializable {
    private static final long serialVersionUID = 1L;
    long n;
    Long vmax;
    long w;

    Cell(long n, Long vmax, long w) {
      this.n = n;
      this.vmax = vmax;
      this.w = w;
    }

    void merge(Cell o) {
      n += o.n;
      if (o.vmax != null && (vmax == null || o.vmax > vmax)) {
        vmax = o.vmax;
      }
      w = Math.max(w, o.w);
    }
  }

  /** the metrics' names (the tally's kinds), in the order {@link Local#count} takes them */
  final String[] metrics;
  /** a latency above this is a clock-skew suspect (latency.SKEW_LIMIT_MS) */
  final long skewLimit;

  private HashMap<Key, Cell> cells = new HashMap<>();

  public Tally(String[] metrics, long skewLimit) {
    this.metrics = metrics.clone();
    this.skewLimit = skewLimit;
  }

  @Override
  public boolean isZero() {
    return cells.isEmpty();
  }

  @Override
  public Tally copy() {
    Tally t = new Tally(metrics, skewLimit);
    t.add(cells);
    return t;
  }

  @Override
  public void reset() {
    cells = new HashMap<>();
  }

  @Override
  public void add(Map<Key, Cell> v) {
    for (Map.Entry<Key, Cell> e : v.entrySet()) {
      Cell c = e.getValue();
      Cell old = cells.get(e.getKey());
      if (old == null) {
        cells.put(e.getKey(), new Cell(c.n, c.vmax, c.w));
      } else {
        old.merge(c);
      }
    }
  }

  @Override
  public void merge(AccumulatorV2<Map<Key, Cell>, Map<Key, Cell>> other) {
    add(other.value());
  }

  @Override
  public Map<Key, Cell> value() {
    return cells;
  }

  /** The merged cells as a DataFrame: window_start_ms, topic_h, group_h, kind, b, n, vmax, w. */
  public Dataset<Row> frame(SparkSession spark) {
    List<Row> rows = new ArrayList<>(cells.size());
    for (Map.Entry<Key, Cell> e : cells.entrySet()) {
      Key k = e.getKey();
      Cell c = e.getValue();
      rows.add(RowFactory.create(k.window, k.topic, k.group, k.kind, k.b, c.n, c.vmax, c.w));
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

  /** One task's counts, in arrays (no allocation per row); {@link #flush} hands them over. */
  Local local() {
    return new Local();
  }

  final class Local {
    /** HdrHistogram-style buckets (latency.bucket): 2 skew keys, 256 exact, 128 per power of 2 */
    final int nBuckets = 2 + 256 + 128 * Math.max(0, 64 - Long.numberOfLeadingZeros(skewLimit) - 8);

    final class Group {
      final Long window, topic, group;
      final long[] outcomes = new long[Cogroup.OUTCOMES.length];
      final long[][] n = new long[metrics.length][];
      final long[][] vmax = new long[metrics.length][];

      Group(Long window, Long topic, Long group) {
        this.window = window;
        this.topic = topic;
        this.group = group;
      }
    }

    final HashMap<List<Long>, Group> groups = new HashMap<>();
    Group last;
    boolean flushed;

    /** One classified row: its keys, outcome code and metric values (nulls not counted). */
    void count(Long window, Long topic, Long group, int outcome, Long[] values) {
      Group g = last;
      if (g == null
          || !Objects.equals(g.window, window)
          || !Objects.equals(g.topic, topic)
          || !Objects.equals(g.group, group)) {
        List<Long> key = java.util.Arrays.asList(window, topic, group);
        g = groups.get(key);
        if (g == null) {
          g = new Group(window, topic, group);
          groups.put(key, g);
        }
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
        int i = index(v);
        if (g.n[m] == null) {
          g.n[m] = new long[nBuckets];
          g.vmax[m] = new long[nBuckets];
        }
        if (g.n[m][i]++ == 0 || v > g.vmax[m][i]) {
          g.vmax[m][i] = v;
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

    /** This task's cells, into the accumulator (once: at the end of its partition). */
    void flush() {
      if (flushed) {
        return;
      }
      flushed = true;
      HashMap<Key, Cell> out = new HashMap<>();
      for (Group g : groups.values()) {
        for (int o = 0; o < g.outcomes.length; o++) {
          if (g.outcomes[o] > 0) {
            out.put(
                new Key(g.window, g.topic, g.group, Cogroup.OUTCOMES[o], 0L),
                new Cell(g.outcomes[o], null, 1L));
          }
        }
        for (int m = 0; m < metrics.length; m++) {
          if (g.n[m] == null) {
            continue;
          }
          for (int i = 0; i < nBuckets; i++) {
            long n = g.n[m][i];
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
            out.put(new Key(g.window, g.topic, g.group, metrics[m], b), new Cell(n, g.vmax[m][i], w));
          }
        }
      }
      add(out);
    }
  }
}

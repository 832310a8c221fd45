package io.tracemq.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import org.apache.spark.Partition;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.rdd.PartitionCoalescer;
import org.apache.spark.rdd.PartitionGroup;
import org.apache.spark.rdd.RDD;
import org.apache.spark.rdd.UnionRDD;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

import scala.Option;
import scala.jdk.javaapi.CollectionConverters;
import scala.reflect.ClassTag$;

/**
 * The classification's reduce side as one pass per msgId (issue 19 goal 4): the rows of the
 * producer side, the consume side and the last deliveries of one msgId, side by side in one
 * task (the input is hash-partitioned and sorted by the msgId's hash: {@code
 * tracemq_spark.classify.cogroup_input}), give that message's classified rows.
 *
 * <p>It computes what {@code tracemq_spark.classify}'s DataFrame steps compute — {@code pubs},
 * {@code expected_deliveries}, {@code attempts}, {@code consumed}, {@code meet} — with the same
 * SQL semantics (three-valued logic, {@code min_by}, the joins' multiplicities), except one
 * term: whether an orphan's msgId was created inside the read range, which the Python side
 * decides afterwards with the same Spark expression as the DataFrame path (the {@code
 * _orphan_check} column marks the rows that need it). The DataFrame path is the reference;
 * {@code tests/spark/test_cogroup.py} holds the two to each other.
 */
public final class Cogroup {
  private Cogroup() {}

  // ---- the input row (tracemq_spark.classify.COGROUP_COLS and COGROUP_SLOTS) ---------------
  static final int PKEY = 0, K = 1, SIDE = 2, TS = 3, COST = 4;
  /** slots: producer o / consume rid / delivery group */
  static final int L1 = 5;
  /** producer store_time / consume group / delivery retry_queue_offset */
  static final int L2 = 6;
  /** producer queue_offset / consume client / delivery retry_committed */
  static final int L3 = 7;
  /** producer topic / consume SubBefore's topic / delivery dlq_queue_offset */
  static final int L4 = 8;
  /** producer tags, store address */
  static final int L5 = 9, L6 = 10;
  /** producer msg_type / consume retry_times / delivery retry_reconsume */
  static final int I1 = 11;
  /** producer queue_id */
  static final int I2 = 12;
  /** three nullable 0/1 values, two bits each (0 false, 1 true, 2 null): producer
   * is_commit, is_rollback, is_recall; consume b, d, success */
  static final int FLAGS = 13;
  /** producer strings for the anomalies (tags, keys, store address, producer group); null
   * on the other sides */
  static final int S1 = 14, S2 = 15, S3 = 16, S4 = 17;

  static final int SIDE_PROD = 0, SIDE_CONS = 1, SIDE_DELIVERY = 2;

  /**
   * The classified rows of {@code input} (columns as above, partitioned by {@code k}; each task
   * sorts its rows by {@code k}, or with {@code byCreation} by {@link MsgIdKey#of} its msgId and
   * {@code k}, the msgId's hash), with {@code schema} (the DataFrame path's classified schema plus a trailing boolean
   * {@code _orphan_check}).
   *
   * @param lookups the subscriptions, clients and committed offsets ({@link #lookups})
   * @param params f_ms, t_ms, window_ms, horizon_ms, max_delay_ms, max_reconsume_times, cutoff
   * @param tallied the columns a CONSUMED row keeps without keepClassified (classify.TALLIED_COLS)
   * @param tally counts the rows as they are emitted ({@link Tally}; registered), or null
   */
  public static Dataset<Row> classify(
      Dataset<Row> input,
      Lookups lookups,
      long[] broadcastingGroups,
      long[] params,
      boolean keepClassified,
      boolean byCreation,
      String[] tallied,
      String schemaJson,
      Tally tally) {
    return classified(
        input.queryExecution().toRdd(),
        input.schema(),
        input.sparkSession(),
        lookups,
        broadcastingGroups,
        params,
        keepClassified,
        byCreation,
        tallied,
        schemaJson,
        tally);
  }

  /**
   * {@code rows} (the co-group's input columns {@code cols} and the msgId column {@code key})
   * split by the msgId ranges {@code bounds} (ascending; {@link Ranges#plan}): one RDD per
   * range, {@code [bounds[i-1], bounds[i])}, the first range also holding the rows whose {@code
   * key} is null — every row in exactly one. Each is a scan of its own with its range's
   * condition, which Parquet's row-group statistics answer for files sorted by msgId (the
   * collector's): a range reads only its row groups. Each range's plan is analysed, optimised
   * and made physical on its own (~0.1 – 0.4 s each at 10M messages, 16 of them): two threads
   * make them.
   */
  @SuppressWarnings({"unchecked", "rawtypes"})
  public static RDD<InternalRow>[] byRange(
      Dataset<Row> rows, String key, String[] bounds, String[] cols) throws Exception {
    int n = bounds.length + 1;
    Column[] out = new Column[cols.length];
    for (int i = 0; i < cols.length; i++) {
      out[i] = functions.col(cols[i]);
    }
    SparkSession spark = rows.sparkSession();
    RDD<InternalRow>[] rdds = new RDD[n];
    ExecutorService pool =
        Executors.newFixedThreadPool(
            Math.min(2, n),
            r -> {
              Thread t = new Thread(r, "tracemq-ranges-plan");
              t.setDaemon(true);
              return t;
            });
    try {
      List<Future<?>> done = new ArrayList<>();
      for (int i = 0; i < n; i++) {
        final int r = i;
        done.add(
            pool.submit(
                () -> {
                  SparkSession.setActiveSession(spark);
                  Column c = functions.col(key);
                  Column cond = functions.lit(true);
                  if (r > 0) {
                    cond = c.geq(bounds[r - 1]);
                  }
                  if (r < n - 1) {
                    cond = r == 0 ? c.isNull().or(c.lt(bounds[r])) : cond.and(c.lt(bounds[r]));
                  }
                  rdds[r] = rows.where(cond).select(out).queryExecution().toRdd();
                  return null;
                }));
      }
      for (Future<?> f : done) {
        try {
          f.get();
        } catch (ExecutionException e) {
          Throwable c = e.getCause();
          throw c instanceof Exception ? (Exception) c : new RuntimeException(c);
        }
      }
    } finally {
      pool.shutdownNow();
    }
    return rdds;
  }

  /**
   * As {@link #classify}, of rows split by msgId range instead of partitioned by hash: {@code
   * events[i]} holds the lake's rows whose msgId is in the i-th range ({@link #byRange}), and
   * partition i of {@code deliveries} (null: none) the last deliveries' ({@link #ranges} or
   * {@link #deliveryRanges}); each range is one task reading its partitions one after the
   * other: every msgId's rows meet in one task without an exchange. {@code inputSchemaJson}:
   * the rows' (classify's input columns).
   */
  public static Dataset<Row> classifyRanges(
      RDD<InternalRow>[] events,
      RDD<InternalRow> deliveries,
      String inputSchemaJson,
      Lookups lookups,
      long[] broadcastingGroups,
      long[] params,
      boolean keepClassified,
      boolean byCreation,
      String[] tallied,
      String schemaJson,
      Tally tally) {
    int n = events.length;
    List<RDD<InternalRow>> rdds = new ArrayList<>(List.of(events));
    if (deliveries != null) {
      if (deliveries.getNumPartitions() != n) {
        throw new IllegalArgumentException(
            "ranges: " + n + " of events, " + deliveries.getNumPartitions() + " of deliveries");
      }
      rdds.add(deliveries);
    }
    RDD<InternalRow> union = union(rdds);
    List<List<Integer>> members = new ArrayList<>();
    int at = 0;
    for (int i = 0; i < n; i++) {
      List<Integer> m = new ArrayList<>();
      for (int p = 0; p < events[i].getNumPartitions(); p++) {
        m.add(at++);
      }
      members.add(m);
    }
    for (int i = 0; deliveries != null && i < n; i++) {
      members.get(i).add(at++);
    }
    return classified(
        grouped(union, members),
        (StructType) DataType.fromJson(inputSchemaJson),
        SparkSession.active(),
        lookups,
        broadcastingGroups,
        params,
        keepClassified,
        byCreation,
        tallied,
        schemaJson,
        tally);
  }

  /** {@code rdds} (one per range) as one RDD whose partition i holds {@code rdds[i]}'s. */
  public static RDD<InternalRow> ranges(RDD<InternalRow>[] rdds) {
    List<List<Integer>> members = new ArrayList<>();
    int at = 0;
    for (RDD<InternalRow> r : rdds) {
      List<Integer> m = new ArrayList<>();
      for (int p = 0; p < r.getNumPartitions(); p++) {
        m.add(at++);
      }
      members.add(m);
    }
    return grouped(union(List.of(rdds)), members);
  }

  /**
   * The rows of {@link Snapshot#rangeRows} as one RDD whose partition i holds range i's: the
   * bytes go to the tasks as a broadcast (in local mode the executors read the driver's copy).
   */
  public static RDD<InternalRow> deliveryRanges(byte[][] ranges, int nFields) {
    JavaSparkContext jsc = JavaSparkContext.fromSparkContext(SparkSession.active().sparkContext());
    Broadcast<byte[][]> bytes = jsc.broadcast(ranges);
    List<Integer> idx = new ArrayList<>();
    for (int i = 0; i < ranges.length; i++) {
      idx.add(i);
    }
    return jsc.parallelize(idx, ranges.length)
        .mapPartitionsWithIndex(
            (Integer i, Iterator<Integer> ignored) -> unsafeRows(bytes.value()[i], nFields), true)
        .rdd();
  }

  /** The unsafe rows of {@code buf}: each after its length (an int). */
  static Iterator<InternalRow> unsafeRows(byte[] buf, int nFields) {
    return new Iterator<InternalRow>() {
      int at = 0;

      @Override
      public boolean hasNext() {
        return at < buf.length;
      }

      @Override
      public InternalRow next() {
        if (at >= buf.length) {
          throw new java.util.NoSuchElementException();
        }
        int len =
            ((buf[at] & 0xff) << 24)
                | ((buf[at + 1] & 0xff) << 16)
                | ((buf[at + 2] & 0xff) << 8)
                | (buf[at + 3] & 0xff);
        UnsafeRow r = new UnsafeRow(nFields);
        r.pointTo(buf, Platform.BYTE_ARRAY_OFFSET + at + 4, len);
        at += 4 + len;
        return r;
      }
    };
  }

  private static RDD<InternalRow> union(List<RDD<InternalRow>> rdds) {
    return new UnionRDD<>(
        rdds.get(0).sparkContext(),
        CollectionConverters.asScala(rdds).toSeq(),
        ClassTag$.MODULE$.apply(InternalRow.class));
  }

  private static RDD<InternalRow> grouped(RDD<InternalRow> union, List<List<Integer>> members) {
    int[][] groups = new int[members.size()][];
    for (int i = 0; i < groups.length; i++) {
      groups[i] = members.get(i).stream().mapToInt(Integer::intValue).toArray();
    }
    return union.coalesce(groups.length, false, Option.apply(new Grouped(groups)), null);
  }

  /** The union's partitions grouped as given: group i holds the partitions {@code groups[i]}. */
  static final class Grouped implements PartitionCoalescer, Serializable {
    private static final long serialVersionUID = 1L;
    private final int[][] groups;

    Grouped(int[][] groups) {
      this.groups = groups.clone();
    }

    @Override
    public PartitionGroup[] coalesce(int maxPartitions, RDD<?> parent) {
      Partition[] parts = parent.partitions();
      PartitionGroup[] out = new PartitionGroup[groups.length];
      int seen = 0;
      for (int i = 0; i < groups.length; i++) {
        out[i] = new PartitionGroup(Option.empty());
        for (int j : groups[i]) {
          out[i].partitions().addOne(parts[j]);
          seen++;
        }
      }
      if (seen != parts.length) {
        throw new IllegalStateException("ranges: " + seen + " of " + parts.length + " partitions");
      }
      return out;
    }
  }

  /**
   * Range {@code i} of {@link #classifyRanges}' input (either part may be null, not both) as a
   * frame of {@code inputSchemaJson} (to look at one range: the tests, a debugging session).
   */
  public static Dataset<Row> rangeFrame(
      RDD<InternalRow>[] events, RDD<InternalRow> deliveries, int i, String inputSchemaJson) {
    List<RDD<InternalRow>> one = new ArrayList<>();
    if (events != null) {
      one.add(events[i]);
    }
    if (deliveries != null) {
      one.add(
          deliveries
              .toJavaRDD()
              .mapPartitionsWithIndex(
                  (Integer j, Iterator<InternalRow> it) ->
                      j == i ? it : java.util.Collections.<InternalRow>emptyIterator(),
                  true)
              .rdd());
    }
    return SparkSession.active()
        .internalCreateDataFrame(
            union(one), (StructType) DataType.fromJson(inputSchemaJson), false);
  }

  /** The subscriptions, clients and committed offsets, collected to the driver for the tasks. */
  public static Lookups lookups(Dataset<Row> subs, Dataset<Row> clients, Dataset<Row> offsets) {
    return Lookups.of(subs.collectAsList(), clients.collectAsList(), offsets.collectAsList());
  }

  private static Dataset<Row> classified(
      RDD<InternalRow> rows,
      StructType inputSchema,
      SparkSession spark,
      Lookups lookups,
      long[] broadcastingGroups,
      long[] params,
      boolean keepClassified,
      boolean byCreation,
      String[] tallied,
      String schemaJson,
      Tally tally) {
    StructType schema = (StructType) DataType.fromJson(schemaJson);
    Task task =
        new Task(
            lookups,
            broadcastingGroups,
            params,
            keepClassified,
            byCreation,
            java.util.Set.of(tallied),
            schema,
            inputSchema,
            tally);
    JavaRDD<InternalRow> out = rows.toJavaRDD().mapPartitions(task);
    return spark.internalCreateDataFrame(out.rdd(), schema, false);
  }

  // ---- the small inputs -------------------------------------------------------------------

  /** A subscription segment (classify.subs_frame). */
  static final class Seg implements Serializable {
    final Long groupH, tagH;
    final long start, end;
    final Boolean bcast;

    Seg(Long groupH, Long tagH, long start, long end, Boolean bcast) {
      this.groupH = groupH;
      this.tagH = tagH;
      this.start = start;
      this.end = end;
      this.bcast = bcast;
    }
  }

  /** The broadcast look-ups: subscription segments by topic, clients, committed offsets. */
  public static final class Lookups implements Serializable {
    final Map<Long, List<Seg>> segsByTopic = new HashMap<>();
    final Map<LongKey, List<Long>> clients = new HashMap<>();
    final Map<LongKey, List<Long>> offsets = new HashMap<>();

    static Long l(Row r, int i) {
      return r.isNullAt(i) ? null : ((Number) r.get(i)).longValue();
    }

    static Lookups of(List<Row> subs, List<Row> clients, List<Row> offsets) {
      Lookups lk = new Lookups();
      // s_group_h, s_topic_h, s_tag_h, s_start, s_end, s_bcast
      for (Row r : subs) {
        Long topic = l(r, 1);
        if (topic == null || r.isNullAt(3) || r.isNullAt(4)) {
          continue; // never matches: the join's condition is null
        }
        Boolean bcast = r.isNullAt(5) ? null : r.getBoolean(5);
        lk.segsByTopic
            .computeIfAbsent(topic, x -> new ArrayList<>())
            .add(new Seg(l(r, 0), l(r, 2), r.getLong(3), r.getLong(4), bcast));
      }
      // c_group_h, c_topic_h, c_client_h
      for (Row r : clients) {
        if (r.isNullAt(0) || r.isNullAt(1)) {
          continue;
        }
        lk.clients.computeIfAbsent(new LongKey(l(r, 0), l(r, 1)), x -> new ArrayList<>()).add(l(r, 2));
      }
      // o_group_h, o_topic_h, o_store_h, o_queue_id, o_client_h, o_committed
      for (Row r : offsets) {
        boolean nullKey = false;
        for (int i = 0; i < 5; i++) {
          nullKey |= r.isNullAt(i);
        }
        if (nullKey) {
          continue;
        }
        LongKey key = new LongKey(l(r, 0), l(r, 1), l(r, 2), l(r, 3), l(r, 4));
        lk.offsets.computeIfAbsent(key, x -> new ArrayList<>()).add(l(r, 5));
      }
      return lk;
    }
  }

  // ---- SQL's three-valued logic and null-propagating comparisons ----------------------------

  static Boolean and(Boolean a, Boolean b) {
    if (Boolean.FALSE.equals(a) || Boolean.FALSE.equals(b)) return Boolean.FALSE;
    if (a == null || b == null) return null;
    return Boolean.TRUE;
  }

  static Boolean or(Boolean a, Boolean b) {
    if (Boolean.TRUE.equals(a) || Boolean.TRUE.equals(b)) return Boolean.TRUE;
    if (a == null || b == null) return null;
    return Boolean.FALSE;
  }

  static Boolean not(Boolean a) {
    return a == null ? null : !a;
  }

  static boolean isTrue(Boolean a) {
    return a != null && a;
  }

  static Boolean gt(Long a, Long b) {
    return a == null || b == null ? null : a > b;
  }

  static Boolean ge(Long a, Long b) {
    return a == null || b == null ? null : a >= b;
  }

  static Boolean lt(Long a, Long b) {
    return a == null || b == null ? null : a < b;
  }

  static Boolean eqI(Integer a, int b) {
    return a == null ? null : a == b;
  }

  static Boolean eqL(Long a, Long b) {
    return a == null || b == null ? null : a.longValue() == b.longValue();
  }

  static Long minus(Long a, Long b) {
    return a == null || b == null ? null : a - b;
  }

  static Long plus(Long a, Long b) {
    return a == null || b == null ? null : a + b;
  }

  static Long minL(Long acc, Long v) {
    return v == null ? acc : acc == null || v < acc ? v : acc;
  }

  static Long maxL(Long acc, Long v) {
    return v == null ? acc : acc == null || v > acc ? v : acc;
  }

  static Integer maxI(Integer acc, Integer v) {
    return v == null ? acc : acc == null || v > acc ? v : acc;
  }

  static Long sumL(Long acc, Long v) {
    return v == null ? acc : acc == null ? v : acc + v;
  }

  static Long sumI(Long acc, Integer v) {
    return v == null ? acc : acc == null ? (long) v : acc + v;
  }

  static Integer asInt(Boolean b) {
    return b == null ? null : b ? 1 : 0;
  }

  static <T> T coalesce(T a, T b) {
    return a != null ? a : b;
  }

  // ---- one msgId's rows -----------------------------------------------------------------

  /** One input row's values (copied: the sorter's rows are reused). */
  static final class In {
    int side;
    Long ts, cost, o, storeTime, queueOffset, topicH, tagsH, storeH, rid, gh, ch, th;
    Long rQueueOffset, rCommitted, dlqOffset;
    Integer msgType, queueId, isCommit, isRollback, isRecall, retry, rReconsume;
    Boolean b, d, success;
    /** a Pub's strings (copied out of the sorter's row): tags, keys, store address, group */
    UTF8String tags, keys, storeAddr, producerGroup;
  }

  /** The Pub facts (PUB_COLS) of a msgId; null: no Pub. */
  static final class Pub {
    Long pubTs, topicH, tagsH, sendCost, storeTime, storeH, queueOffset;
    boolean pubOk;
    Integer msgType, queueId, txCommit, txRollback, recalled;
    Boolean inWindow, expectedAnywhere;
    /** the anomalies' producer strings: of the least Pub by (o, tags, keys, store address,
     * group), nulls first — classify.pubs' min of that struct */
    UTF8String tags, keys, storeAddr, producerGroup;
  }

  /** An expected row after the offsets' and deliveries' joins. */
  static final class Exp {
    Long groupH;
    long ck;
    Long committed;
    In del; // null: no last delivery known
  }

  /** An attempt: the consume events of one (msgId, requestId). */
  static final class Att {
    Long gb, ga, cb, ca, th, beforeTs, succTs, succCost, succOrd, afterTs;
    Integer hasBefore, hasAfter, retry, ok, dlq;
    long n;
    boolean succCostSet;
  }

  /** A consumed row (per group, client) after the deliveries' join. */
  static final class Cons {
    Long groupH;
    long ck;
    Long attempts, successes, failedAttempts, inFlight, firstBeforeTs, firstConsumeTs;
    Long successTs, successCost, cTopicH, consumeEvents;
    Integer deadLettered, maxRetry, maxFailedRetry, successRetry;
    boolean firstOkSet;
    In del;

    Cons copyWith(In d) {
      Cons c = new Cons();
      c.groupH = groupH;
      c.ck = ck;
      c.attempts = attempts;
      c.successes = successes;
      c.failedAttempts = failedAttempts;
      c.inFlight = inFlight;
      c.firstBeforeTs = firstBeforeTs;
      c.firstConsumeTs = firstConsumeTs;
      c.successTs = successTs;
      c.successCost = successCost;
      c.cTopicH = cTopicH;
      c.consumeEvents = consumeEvents;
      c.deadLettered = deadLettered;
      c.maxRetry = maxRetry;
      c.maxFailedRetry = maxFailedRetry;
      c.successRetry = successRetry;
      c.del = d;
      return c;
    }
  }

  // the outcomes, in the CASE's order (classify.meet)
  static final int PUB_FAILED = 0, RECALLED = 1, ROLLED_BACK = 2, TX_UNRESOLVED = 3;
  static final int NO_EXPECTED_GROUP = 4, DUPLICATE = 5, CONSUMED_AFTER_RETRY = 6, CONSUMED = 7;
  static final int DEAD_LETTERED = 8, TRACE_INCOMPLETE = 9, IN_FLIGHT = 10, FAILED = 11;
  static final int TRACE_LOST = 12, PENDING = 13, NOT_CONSUMED = 14, UNEXPECTED_GROUP = 15;
  static final int ORPHAN_CONSUME = 16, NONE = -1;
  static final String[] OUTCOMES = {
    "PUB_FAILED", "RECALLED", "ROLLED_BACK", "TX_UNRESOLVED", "NO_EXPECTED_GROUP", "DUPLICATE",
    "CONSUMED_AFTER_RETRY", "CONSUMED", "DEAD_LETTERED", "TRACE_INCOMPLETE", "IN_FLIGHT",
    "FAILED", "TRACE_LOST", "PENDING", "NOT_CONSUMED", "UNEXPECTED_GROUP", "ORPHAN_CONSUME"
  };
}

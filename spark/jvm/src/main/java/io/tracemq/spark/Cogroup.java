package io.tracemq.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.Partition;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.rdd.PartitionCoalescer;
import org.apache.spark.rdd.PartitionGroup;
import org.apache.spark.rdd.RDD;
import org.apache.spark.rdd.UnionRDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
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
   * @param params f_ms, t_ms, window_ms, horizon_ms, max_delay_ms, max_reconsume_times, cutoff
   * @param tallied the columns a CONSUMED row keeps without keepClassified (classify.TALLIED_COLS)
   * @param tally counts the rows as they are emitted ({@link Tally}; registered), or null
   */
  public static Dataset<Row> classify(
      Dataset<Row> input,
      Dataset<Row> subs,
      Dataset<Row> clients,
      Dataset<Row> offsets,
      long[] broadcastingGroups,
      long[] params,
      boolean keepClassified,
      boolean byCreation,
      String[] tallied,
      String schemaJson,
      Tally tally) {
    return classified(
        input.queryExecution().toRdd(),
        input,
        subs,
        clients,
        offsets,
        broadcastingGroups,
        params,
        keepClassified,
        byCreation,
        tallied,
        schemaJson,
        tally);
  }

  /**
   * As {@link #classify}, of rows split by msgId range instead of partitioned by hash: {@code
   * inputs[i]} holds the rows whose msgId is in the i-th range ({@link Ranges#plan}; the
   * columns as {@code classify}'s input), and each range is one task, its input partitions read
   * one after the other: every msgId's rows meet in one task without an exchange.
   */
  public static Dataset<Row> classifyRanges(
      Dataset<Row>[] inputs,
      Dataset<Row> subs,
      Dataset<Row> clients,
      Dataset<Row> offsets,
      long[] broadcastingGroups,
      long[] params,
      boolean keepClassified,
      boolean byCreation,
      String[] tallied,
      String schemaJson,
      Tally tally) {
    List<RDD<InternalRow>> rdds = new ArrayList<>();
    int[] counts = new int[inputs.length];
    for (int i = 0; i < inputs.length; i++) {
      RDD<InternalRow> r = inputs[i].queryExecution().toRdd();
      rdds.add(r);
      counts[i] = r.getNumPartitions();
    }
    SparkSession spark = inputs[0].sparkSession();
    RDD<InternalRow> union =
        new UnionRDD<>(
            spark.sparkContext(),
            CollectionConverters.asScala(rdds).toSeq(),
            ClassTag$.MODULE$.apply(InternalRow.class));
    RDD<InternalRow> ranges =
        union.coalesce(inputs.length, false, Option.apply(new Contiguous(counts)), null);
    return classified(
        ranges,
        inputs[0],
        subs,
        clients,
        offsets,
        broadcastingGroups,
        params,
        keepClassified,
        byCreation,
        tallied,
        schemaJson,
        tally);
  }

  /** The union's partitions grouped as its inputs were: group i holds input i's partitions. */
  static final class Contiguous implements PartitionCoalescer, Serializable {
    private static final long serialVersionUID = 1L;
    private final int[] counts;

    Contiguous(int[] counts) {
      this.counts = counts.clone();
    }

    @Override
    public PartitionGroup[] coalesce(int maxPartitions, RDD<?> parent) {
      Partition[] parts = parent.partitions();
      PartitionGroup[] groups = new PartitionGroup[counts.length];
      int j = 0;
      for (int i = 0; i < counts.length; i++) {
        groups[i] = new PartitionGroup(Option.empty());
        for (int c = 0; c < counts[i]; c++) {
          groups[i].partitions().addOne(parts[j++]);
        }
      }
      if (j != parts.length) {
        throw new IllegalStateException("ranges: " + j + " of " + parts.length + " partitions");
      }
      return groups;
    }
  }

  private static Dataset<Row> classified(
      RDD<InternalRow> rows,
      Dataset<Row> input,
      Dataset<Row> subs,
      Dataset<Row> clients,
      Dataset<Row> offsets,
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
            Lookups.of(subs.collectAsList(), clients.collectAsList(), offsets.collectAsList()),
            broadcastingGroups,
            params,
            keepClassified,
            byCreation,
            java.util.Set.of(tallied),
            schema,
            input.schema(),
            tally);
    JavaRDD<InternalRow> out = rows.toJavaRDD().mapPartitions(task);
    SparkSession spark = input.sparkSession();
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
  static final class Lookups implements Serializable {
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

package io.tracemq.spark;

import static io.tracemq.spark.Cogroup.*;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;

import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.UnsafeExternalRowSorter;
import org.apache.spark.util.TaskCompletionListener;
import org.apache.spark.util.collection.unsafe.sort.PrefixComparators;
import org.apache.spark.util.collection.unsafe.sort.RecordComparator;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/** One task's pass over its msgIds (see {@link Cogroup}). */
final class Task implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
  private static final long serialVersionUID = 1L;
  static final int MSG_HALF = 1, MSG_DELAY = 3;
  /** the prefix of a consume's pkey without a msgId (classify.attempts) */
  static final UTF8String NO_ID = UTF8String.fromString("\u0000");

  final Cogroup.Lookups lk;
  final HashSet<Long> bh = new HashSet<>();
  final long fMs, tMs, windowMs, horizonMs, maxDelayMs, maxReconsume, cutoff;
  final boolean keepClassified;
  /** the sort key: {@link MsgIdKey#of} the row's msgId and its hash {@code k} (else {@code k}) */
  final boolean byCreation;
  // output columns: index in the schema (-1: absent) and kind (0 long, 1 int, 2 string, 3 bool)
  final int width;
  final int[] kind;
  final int cOutcome, cWindow, cTopic, cGroup, cClient, cPubTs, cMsgType, cTags, cStore;
  final int cQueueId, cQueueOffset, cCommitted, cRReconsume, cRQueueOffset, cRCommitted, cDlq;
  final int cDue, cAttempts, cSuccesses, cFailed, cInFlight, cMaxRetry, cMaxFailedRetry;
  final int cEvents, cFirstTs, cSuccessTs, cSendCost, cStoreToConsume, cConsumeCost, cE2e;
  final int cMsgId, cOrphanCheck, cTagsS, cKeys, cStoreAddr, cProducerGroup;
  final boolean[] tallied;
  final UTF8String[] outcomeNames;
  /** the input's schema (classify.COGROUP_COLS), for the sorter */
  final StructType inputSchema;
  /** the tally of the emitted rows (null: none kept) and its metrics' columns */
  final Tally tally;
  final int[] cMetrics;
  /** the metrics' values of the row being counted (one array, reused) */
  final Long[] metricValues;

  Task(
      Cogroup.Lookups lk,
      long[] bh,
      long[] p,
      boolean keepClassified,
      boolean byCreation,
      java.util.Set<String> talliedNames,
      StructType schema,
      StructType inputSchema,
      Tally tally) {
    this.lk = lk;
    this.inputSchema = inputSchema;
    this.tally = tally;
    for (long h : bh) {
      this.bh.add(h);
    }
    fMs = p[0];
    tMs = p[1];
    windowMs = p[2];
    horizonMs = p[3];
    maxDelayMs = p[4];
    maxReconsume = p[5];
    cutoff = p[6];
    this.keepClassified = keepClassified;
    this.byCreation = byCreation;
    width = schema.length();
    kind = new int[width];
    tallied = new boolean[width];
    for (int i = 0; i < width; i++) {
      DataType t = schema.fields()[i].dataType();
      kind[i] =
          t.equals(DataTypes.LongType)
              ? 0
              : t.equals(DataTypes.IntegerType)
                  ? 1
                  : t.equals(DataTypes.StringType) ? 2 : t.equals(DataTypes.BooleanType) ? 3 : -1;
      if (kind[i] < 0) {
        throw new IllegalArgumentException("unexpected type of " + schema.fields()[i]);
      }
      tallied[i] = talliedNames.contains(schema.fields()[i].name());
    }
    cOutcome = idx(schema, "outcome");
    cWindow = idx(schema, "window_start_ms");
    cTopic = idx(schema, "topic_h");
    cGroup = idx(schema, "group_h");
    cClient = idx(schema, "client_h");
    cPubTs = idx(schema, "pub_ts");
    cMsgType = idx(schema, "msg_type");
    cTags = idx(schema, "tags_h");
    cStore = idx(schema, "store_h");
    cQueueId = idx(schema, "queue_id");
    cQueueOffset = idx(schema, "queue_offset");
    cCommitted = idx(schema, "committed_offset");
    cRReconsume = idx(schema, "retry_reconsume");
    cRQueueOffset = idx(schema, "retry_queue_offset");
    cRCommitted = idx(schema, "retry_committed");
    cDlq = idx(schema, "dlq_queue_offset");
    cDue = idx(schema, "due_ts");
    cAttempts = idx(schema, "attempts");
    cSuccesses = idx(schema, "successes");
    cFailed = idx(schema, "failed_attempts");
    cInFlight = idx(schema, "in_flight_attempts");
    cMaxRetry = idx(schema, "max_retry_times");
    cMaxFailedRetry = idx(schema, "max_failed_retry");
    cEvents = idx(schema, "consume_events");
    cFirstTs = idx(schema, "first_consume_ts");
    cSuccessTs = idx(schema, "success_ts");
    cSendCost = idx(schema, "send_cost_ms");
    cStoreToConsume = idx(schema, "store_to_consume_ms");
    cConsumeCost = idx(schema, "consume_cost_ms");
    cE2e = idx(schema, "end_to_end_ms");
    cMsgId = idx(schema, "msg_id");
    cOrphanCheck = idx(schema, "_orphan_check");
    cTagsS = idx(schema, "tags");
    cKeys = idx(schema, "keys");
    cStoreAddr = idx(schema, "store_addr");
    cProducerGroup = idx(schema, "producer_group");
    cMetrics = new int[tally == null ? 0 : tally.metrics.length];
    for (int m = 0; m < cMetrics.length; m++) {
      cMetrics[m] = idx(schema, tally.metrics[m]);
      if (cMetrics[m] < 0) {
        throw new IllegalArgumentException("no column " + tally.metrics[m]);
      }
    }
    metricValues = new Long[cMetrics.length];
    outcomeNames = new UTF8String[OUTCOMES.length];
    for (int i = 0; i < OUTCOMES.length; i++) {
      outcomeNames[i] = UTF8String.fromString(OUTCOMES[i]);
    }
  }

  static int idx(StructType schema, String name) {
    return schema.getFieldIndex(name).isDefined() ? schema.fieldIndex(name) : -1;
  }

  @Override
  public Iterator<InternalRow> call(Iterator<InternalRow> rows) throws java.io.IOException {
    return new Groups(sorted(rows));
  }

  /**
   * The sort key of an input row (see {@link #byCreation}): of an {@code UnsafeRow} (the
   * sorter's rows, in and out) from the msgId's bytes in place.
   */
  long key(InternalRow row) {
    long k = row.getLong(K);
    if (!byCreation || row.isNullAt(PKEY)) {
      return k;
    }
    if (row instanceof UnsafeRow) {
      UnsafeRow u = (UnsafeRow) row;
      long offsetAndSize = u.getLong(PKEY);
      return MsgIdKey.of(
          u.getBaseObject(),
          u.getBaseOffset() + (offsetAndSize >>> 32),
          (int) offsetAndSize,
          k);
    }
    return MsgIdKey.of(row.getUTF8String(PKEY), k);
  }

  /**
   * The partition's rows sorted by {@link #key} with Spark's own sorter (a radix sort on the key,
   * spilling as SortExec's would), read straight from it: a SortExec in the input's plan
   * handed each row through whole-stage code's row buffer (a linked list) on its way here.
   * Rows of one key come in no particular order (the runs are split by msgId anyway).
   */
  Iterator<InternalRow> sorted(Iterator<InternalRow> rows) throws java.io.IOException {
    UnsafeExternalRowSorter.PrefixComputer prefix =
        new UnsafeExternalRowSorter.PrefixComputer() {
          final Prefix p = new Prefix();

          @Override
          public Prefix computePrefix(InternalRow row) {
            // (k: the msgId's hash, never null; the msgId neither)
            p.value = key(row);
            p.isNull = false;
            return p;
          }
        };
    // the prefix is the whole key: equal prefixes are equal keys
    RecordComparator same =
        new RecordComparator() {
          @Override
          public int compare(Object l, long lo, int ll, Object r, long ro, int rl) {
            return 0;
          }
        };
    UnsafeExternalRowSorter sorter =
        UnsafeExternalRowSorter.createWithRecordComparator(
            inputSchema,
            () -> same,
            PrefixComparators.LONG,
            prefix,
            SparkEnv.get().memoryManager().pageSizeBytes(),
            true);
    TaskContext ctx = TaskContext.get();
    if (ctx != null) {
      ctx.addTaskCompletionListener((TaskCompletionListener) c -> sorter.cleanupResources());
    }
    // (a shuffle's rows are unsafe rows already; anything else is converted)
    UnsafeProjection unsafe = UnsafeProjection.create(inputSchema);
    Iterator<UnsafeRow> unsafeRows =
        new Iterator<UnsafeRow>() {
          @Override
          public boolean hasNext() {
            return rows.hasNext();
          }

          @Override
          public UnsafeRow next() {
            InternalRow r = rows.next();
            return r instanceof UnsafeRow ? (UnsafeRow) r : unsafe.apply(r);
          }
        };
    scala.collection.Iterator<UnsafeRow> in =
        scala.jdk.javaapi.CollectionConverters.asScala(unsafeRows);
    return scala.jdk.javaapi.CollectionConverters.asJava(sorter.sort(in));
  }

  /** The classified rows of a partition, one msgId (a run of equal {@link #key}) at a time. */
  final class Groups implements Iterator<InternalRow> {
    final Iterator<InternalRow> rows;
    final ArrayDeque<InternalRow> out = new ArrayDeque<>();
    InternalRow pending; // the first row of the next run (already read)
    final List<UTF8String> keys = new ArrayList<>();
    final List<In> ins = new ArrayList<>();

    Groups(Iterator<InternalRow> rows) {
      this.rows = rows;
      pending = rows.hasNext() ? rows.next() : null;
    }

    @Override
    public boolean hasNext() {
      while (out.isEmpty() && pending != null) {
        nextRun();
      }
      return !out.isEmpty();
    }

    @Override
    public InternalRow next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      return out.poll();
    }

    void nextRun() {
      keys.clear();
      ins.clear();
      long k = key(pending);
      InternalRow r = pending;
      // the run's msgId (copied: the sorter reuses its rows); the others are compared in place
      UTF8String first = r.getUTF8String(PKEY).clone();
      UTF8String key = first;
      boolean oneKey = true;
      while (true) {
        if (oneKey && !key.equals(first)) {
          // two msgIds with one hash: from here on every row's key is kept
          oneKey = false;
          for (int i = 0; i < ins.size(); i++) {
            keys.add(first);
          }
        }
        if (!oneKey) {
          keys.add(key.clone());
        }
        ins.add(read(r));
        if (!rows.hasNext()) {
          pending = null;
          break;
        }
        r = rows.next();
        key = r.getUTF8String(PKEY);
        // the run's msgId has the run's key: the key is computed where the msgId changes
        if (!key.equals(first) && key(r) != k) {
          pending = r;
          break;
        }
      }
      if (oneKey) {
        group(first, ins, out);
      } else {
        // split the run by msgId
        Map<UTF8String, List<In>> by = new LinkedHashMap<>();
        for (int i = 0; i < keys.size(); i++) {
          by.computeIfAbsent(keys.get(i), x -> new ArrayList<>()).add(ins.get(i));
        }
        for (Map.Entry<UTF8String, List<In>> e : by.entrySet()) {
          group(e.getKey(), e.getValue(), out);
        }
      }
    }
  }

  static Long lg(InternalRow r, int i) {
    return r.isNullAt(i) ? null : r.getLong(i);
  }

  static Integer in(InternalRow r, int i) {
    return r.isNullAt(i) ? null : r.getInt(i);
  }

  /** A string of the row, copied (the sorter reuses its rows' memory). */
  static UTF8String str(InternalRow r, int i) {
    return r.isNullAt(i) ? null : r.getUTF8String(i).clone();
  }

  /** Strings in Spark's ascending order, nulls first (a struct's fields in a min). */
  static int cmp(UTF8String a, UTF8String b) {
    if (a == null || b == null) {
      return a == null ? (b == null ? 0 : -1) : 1;
    }
    return a.compareTo(b);
  }

  /** Whether Pub ``x`` comes before ``y`` by (o, tags, keys, store address, group). */
  static boolean before(In x, In y) {
    if (x.o.longValue() != y.o.longValue()) {
      return x.o < y.o;
    }
    int c = cmp(x.tags, y.tags);
    if (c == 0) {
      c = cmp(x.keys, y.keys);
    }
    if (c == 0) {
      c = cmp(x.storeAddr, y.storeAddr);
    }
    if (c == 0) {
      c = cmp(x.producerGroup, y.producerGroup);
    }
    return c < 0;
  }

  static Boolean bo(InternalRow r, int i) {
    return r.isNullAt(i) ? null : r.getBoolean(i);
  }

  /** The ``i``-th value packed in ``flags`` (classify._flags): null, 0 or 1. */
  static Integer flag(int flags, int i) {
    int code = (flags >>> (2 * i)) & 3;
    return code == 2 ? null : code;
  }

  static Boolean flagB(int flags, int i) {
    Integer v = flag(flags, i);
    return v == null ? null : v == 1;
  }

  static In read(InternalRow r) {
    In x = new In();
    x.side = r.getInt(SIDE);
    int flags = r.isNullAt(FLAGS) ? 0b101010 : r.getInt(FLAGS);
    switch (x.side) {
      case SIDE_PROD:
        x.ts = lg(r, TS);
        x.cost = lg(r, COST);
        x.o = lg(r, L1);
        x.storeTime = lg(r, L2);
        x.queueOffset = lg(r, L3);
        x.topicH = lg(r, L4);
        x.tagsH = lg(r, L5);
        x.storeH = lg(r, L6);
        x.msgType = in(r, I1);
        x.queueId = in(r, I2);
        x.isCommit = flag(flags, 0);
        x.isRollback = flag(flags, 1);
        x.isRecall = flag(flags, 2);
        if (x.o != null) {
          // (only a Pub's: EndTransaction and Recall rows give no strings)
          x.tags = str(r, S1);
          x.keys = str(r, S2);
          x.storeAddr = str(r, S3);
          x.producerGroup = str(r, S4);
        }
        break;
      case SIDE_CONS:
        x.ts = lg(r, TS);
        x.cost = lg(r, COST);
        x.rid = lg(r, L1);
        x.gh = lg(r, L2);
        x.ch = lg(r, L3);
        x.th = lg(r, L4);
        x.retry = in(r, I1);
        x.b = flagB(flags, 0);
        x.d = flagB(flags, 1);
        x.success = flagB(flags, 2);
        break;
      default:
        x.gh = lg(r, L1);
        x.rQueueOffset = lg(r, L2);
        x.rCommitted = lg(r, L3);
        x.dlqOffset = lg(r, L4);
        x.rReconsume = in(r, I1);
    }
    return x;
  }

  // ---- the steps, for one msgId -----------------------------------------------------------

  /** classify.pubs: the first successful Pub wins (min of the order ``o``). */
  Pub pubs(List<In> prods) {
    In first = null, detail = null;
    Integer commit = null, rollback = null, recall = null;
    for (In x : prods) {
      if (x.o != null && (first == null || x.o < first.o)) {
        first = x;
      }
      if (x.o != null && (detail == null || before(x, detail))) {
        detail = x;
      }
      commit = maxI(commit, x.isCommit);
      rollback = maxI(rollback, x.isRollback);
      recall = maxI(recall, x.isRecall);
    }
    if (first == null) {
      return null;
    }
    Pub p = new Pub();
    p.pubTs = first.ts;
    p.pubOk = (first.o >> 62) == 0;
    p.topicH = first.topicH;
    p.tagsH = first.tagsH;
    p.sendCost = first.cost;
    p.storeTime = first.storeTime;
    p.msgType = first.msgType;
    p.storeH = first.storeH;
    p.queueId = first.queueId;
    p.queueOffset = first.queueOffset;
    p.txCommit = commit;
    p.txRollback = rollback;
    p.recalled = recall;
    p.tags = detail.tags;
    p.keys = detail.keys;
    p.storeAddr = detail.storeAddr;
    p.producerGroup = detail.producerGroup;
    p.inWindow = and(ge(p.pubTs, fMs), lt(p.pubTs, tMs));
    int msgType = p.msgType == null ? 0 : p.msgType;
    p.expectedAnywhere =
        and(
            and(p.pubOk, eqI(p.recalled, 0)),
            or(msgType != MSG_HALF, eqI(p.txCommit, 1)));
    return p;
  }

  /** The deliveries of (msgId, group): the left join's matches, or one null. */
  static List<In> deliveriesOf(List<In> dels, Long groupH) {
    List<In> out = null;
    if (groupH != null) {
      for (In d : dels) {
        if (d.gh != null && d.gh.longValue() == groupH.longValue()) {
          if (out == null) {
            out = new ArrayList<>(1);
          }
          out.add(d);
        }
      }
    }
    if (out == null) {
      out = new ArrayList<>(1);
      out.add(null);
    }
    return out;
  }

  /**
   * classify.expected_deliveries, then meet's joins of the expected side with the committed
   * offsets and the last deliveries.
   */
  List<Exp> expected(Pub p, List<In> dels) {
    List<Exp> out = new ArrayList<>();
    if (p == null || !isTrue(p.inWindow)) {
      return out;
    }
    List<Long[]> rows = new ArrayList<>(); // (group_h, ck)
    List<Seg> segs = p.topicH == null ? null : lk.segsByTopic.get(p.topicH);
    if (segs != null) {
      for (Seg s : segs) {
        Boolean cond =
            and(
                and(
                    and(or(s.tagH == null, eqL(s.tagH, p.tagsH)), ge(p.pubTs, s.start)),
                    lt(p.pubTs, s.end)),
                p.expectedAnywhere);
        if (!isTrue(cond)) {
          continue;
        }
        List<Long> cs =
            s.groupH == null ? null : lk.clients.get(new LongKey(s.groupH, p.topicH));
        boolean bcast = isTrue(s.bcast);
        if (cs == null || cs.isEmpty()) {
          rows.add(new Long[] {s.groupH, 0L});
        } else {
          for (Long c : cs) {
            rows.add(new Long[] {s.groupH, bcast ? (c == null ? 0L : c) : 0L});
          }
        }
      }
    }
    if (rows.isEmpty()) {
      rows.add(new Long[] {null, 0L});
    }
    for (Long[] r : rows) {
      Long g = r[0];
      long ck = r[1];
      List<Long> committed = null;
      if (g != null && p.topicH != null && p.storeH != null && p.queueId != null) {
        committed = lk.offsets.get(new LongKey(g, p.topicH, p.storeH, (long) p.queueId, ck));
      }
      if (committed == null || committed.isEmpty()) {
        committed = new ArrayList<>(1);
        committed.add(null);
      }
      for (Long c : committed) {
        for (In d : deliveriesOf(dels, g)) {
          Exp e = new Exp();
          e.groupH = g;
          e.ck = ck;
          e.committed = c;
          e.del = d;
          out.add(e);
        }
      }
    }
    return out;
  }

  /** classify.attempts then classify.consumed, with the last deliveries joined. */
  List<Cons> consumed(List<In> cons, List<In> dels) {
    List<Cons> out = new ArrayList<>();
    if (cons.isEmpty()) {
      return out;
    }
    Map<Long, Att> atts = new LinkedHashMap<>();
    for (In x : cons) {
      Att a = atts.computeIfAbsent(x.rid, r -> new Att());
      Boolean b = x.b;
      Boolean notB = not(b);
      Boolean after = and(notB, not(x.d));
      Boolean okNow = and(after, x.success);
      if (isTrue(b)) {
        a.gb = maxL(a.gb, x.gh);
        a.cb = maxL(a.cb, x.ch);
        a.beforeTs = minL(a.beforeTs, x.ts);
        a.retry = maxI(a.retry, x.retry);
      }
      if (isTrue(notB)) {
        a.ga = maxL(a.ga, x.gh);
        a.ca = maxL(a.ca, x.ch);
      }
      a.th = maxL(a.th, x.th);
      a.hasBefore = maxI(a.hasBefore, asInt(b));
      a.hasAfter = maxI(a.hasAfter, asInt(after));
      a.ok = maxI(a.ok, asInt(okNow));
      a.dlq = maxI(a.dlq, asInt(x.d));
      if (isTrue(okNow)) {
        Long okTs = x.ts;
        a.succTs = minL(a.succTs, okTs);
        // min_by(cost_time, ok_ts): the first row with the least non-null order
        if (okTs != null && (a.succOrd == null || okTs < a.succOrd)) {
          a.succOrd = okTs;
          a.succCost = x.cost;
        }
      }
      if (isTrue(after)) {
        a.afterTs = minL(a.afterTs, x.ts);
      }
      a.n++;
    }
    // per (group_h, ck); a null group is a key of its own
    Map<List<Long>, Cons> by = new LinkedHashMap<>();
    Map<List<Long>, Long> firstOkOrd = new LinkedHashMap<>();
    for (Att a : atts.values()) {
      Long groupH = coalesce(a.gb, a.ga);
      Long clientH = coalesce(a.cb, a.ca);
      long ck = groupH != null && bh.contains(groupH) ? (clientH == null ? 0L : clientH) : 0L;
      List<Long> key = Arrays.asList(groupH, ck);
      Cons c = by.get(key);
      if (c == null) {
        c = new Cons();
        c.groupH = groupH;
        c.ck = ck;
        by.put(key, c);
      }
      Boolean doneOk = eqI(a.ok, 1);
      Boolean hasAfter1 = eqI(a.hasAfter, 1);
      Boolean failed = and(hasAfter1, not(doneOk));
      c.attempts = sumI(c.attempts, a.dlq == null ? null : 1 - a.dlq);
      c.deadLettered = maxI(c.deadLettered, a.dlq);
      c.successes = sumI(c.successes, a.ok);
      c.failedAttempts = sumI(c.failedAttempts, asInt(failed));
      c.inFlight = sumI(c.inFlight, asInt(and(eqI(a.hasBefore, 1), eqI(a.hasAfter, 0))));
      c.maxRetry = maxI(c.maxRetry, a.retry);
      if (isTrue(failed)) {
        c.maxFailedRetry = maxI(c.maxFailedRetry, a.retry == null ? 0 : a.retry);
      }
      c.firstBeforeTs = minL(c.firstBeforeTs, a.beforeTs);
      // least(before_ts, after_ts): nulls skipped (no ternary here: it would unbox a null)
      Long least = minL(a.beforeTs, a.afterTs);
      c.firstConsumeTs = minL(c.firstConsumeTs, least);
      Long firstOk = isTrue(doneOk) ? a.succTs : null;
      c.successTs = minL(c.successTs, firstOk);
      if (firstOk != null && (!c.firstOkSet || firstOk < firstOkOrd.get(key))) {
        c.firstOkSet = true;
        firstOkOrd.put(key, firstOk);
        c.successCost = a.succCost;
        c.successRetry = a.retry == null ? 0 : a.retry;
      }
      c.cTopicH = maxL(c.cTopicH, a.th);
      c.consumeEvents = sumL(c.consumeEvents, a.n);
    }
    for (Cons c : by.values()) {
      for (In d : deliveriesOf(dels, c.groupH)) {
        out.add(c.copyWith(d));
      }
    }
    return out;
  }

  /** One msgId: its classified rows into ``out``. */
  void group(UTF8String pkey, List<In> rows, ArrayDeque<InternalRow> out) {
    List<In> prods = new ArrayList<>(2), cons = new ArrayList<>(), dels = new ArrayList<>(0);
    for (In x : rows) {
      (x.side == SIDE_PROD ? prods : x.side == SIDE_CONS ? cons : dels).add(x);
    }
    Pub p = pubs(prods);
    List<Exp> exps = expected(p, dels);
    List<Cons> cs = consumed(cons, dels);
    boolean realId = !pkey.startsWith(NO_ID);
    // expected ⟗ consumed on (group_h, ck): null groups match nothing
    boolean[] matched = new boolean[cs.size()];
    for (Exp e : exps) {
      boolean any = false;
      if (e.groupH != null) {
        for (int i = 0; i < cs.size(); i++) {
          Cons c = cs.get(i);
          if (c.groupH != null && c.groupH.longValue() == e.groupH && c.ck == e.ck) {
            matched[i] = true;
            any = true;
            emit(pkey, realId, p, e, c, out);
          }
        }
      }
      if (!any) {
        emit(pkey, realId, p, e, null, out);
      }
    }
    for (int i = 0; i < cs.size(); i++) {
      if (!matched[i]) {
        emit(pkey, realId, p, null, cs.get(i), out);
      }
    }
  }

  /** classify.meet's outcome and columns for one joined row (``e`` or ``c`` may be null). */
  void emit(UTF8String pkey, boolean realId, Pub p, Exp e, Cons c, ArrayDeque<InternalRow> out) {
    Long groupH = e != null && e.groupH != null ? e.groupH : c != null ? c.groupH : null;
    long ck = e != null ? e.ck : c.ck;
    boolean expected = e != null && groupH != null;
    boolean msgLevel = e != null && groupH == null;
    boolean hasConsume = c != null && c.attempts != null;
    // pub(x) = coalesce(e_x, a_x): both are this msgId's Pub facts (a_*: null without a Pub)
    Pub pp = e != null || c != null ? p : null;
    Pub ap = c != null ? p : null; // the a_* columns
    Long pubTs = pp == null ? null : pp.pubTs;
    Integer msgTypeRaw = pp == null ? null : pp.msgType;
    int msgType = msgTypeRaw == null ? 0 : msgTypeRaw;
    Long due =
        plus(pubTs, msgType == MSG_DELAY ? Math.max(maxDelayMs, horizonMs) : horizonMs);
    In ed = e == null ? null : e.del;
    In ad = c == null ? null : c.del;
    Integer rReconsume = coalesce(ed == null ? null : ed.rReconsume, ad == null ? null : ad.rReconsume);
    Long rQueueOffset =
        coalesce(ed == null ? null : ed.rQueueOffset, ad == null ? null : ad.rQueueOffset);
    Long rCommitted = coalesce(ed == null ? null : ed.rCommitted, ad == null ? null : ad.rCommitted);
    Long dlqOffset = coalesce(ed == null ? null : ed.dlqOffset, ad == null ? null : ad.dlqOffset);
    Long committed = e == null ? null : e.committed;
    Long queueOffset = pp == null ? null : pp.queueOffset;
    boolean offsetApplicable = msgType != MSG_HALF && msgType != MSG_DELAY;
    Boolean passed =
        and(offsetApplicable && committed != null, gt(committed, queueOffset));
    boolean hasCopy = rReconsume != null;
    boolean inDlq = dlqOffset != null;
    Boolean lastPassed =
        hasCopy ? Boolean.valueOf(isTrue(gt(rCommitted, rQueueOffset))) : passed;
    Boolean offsetsConsumed = and(lastPassed, !inDlq);
    Integer maxFailedRetry = c == null ? null : c.maxFailedRetry;
    boolean failedLast =
        maxFailedRetry != null && maxFailedRetry >= (rReconsume == null ? 0 : rReconsume);
    Integer deadLettered = c == null ? null : c.deadLettered;
    Integer maxRetry = c == null ? null : c.maxRetry;
    Boolean deadTraced =
        or(eqI(deadLettered, 1), maxRetry == null ? null : (long) maxRetry >= maxReconsume);
    Long attempts = c == null ? null : c.attempts;
    Long successes = c == null ? null : c.successes;
    Integer successRetry = c == null ? null : c.successRetry;
    Boolean afterRetry =
        or(gt(attempts, 1L), successRetry == null ? null : successRetry > 0);
    Long firstTs = c == null ? null : c.firstConsumeTs;
    // orphan_ok but the msgId's creation (decided in Spark, see _orphan_check)
    Boolean inWin = and(ge(firstTs, fMs), lt(firstTs, tMs));
    boolean orphanCheck = false;

    int outcome;
    if (msgLevel && !pp.pubOk) {
      outcome = PUB_FAILED;
    } else if (msgLevel && isTrue(eqI(pp.recalled, 1))) {
      outcome = RECALLED;
    } else if (msgLevel
        && msgType == MSG_HALF
        && isTrue(and(eqI(pp.txRollback, 1), eqI(pp.txCommit, 0)))) {
      outcome = ROLLED_BACK;
    } else if (msgLevel && msgType == MSG_HALF && isTrue(eqI(pp.txCommit, 0))) {
      outcome = TX_UNRESOLVED;
    } else if (msgLevel) {
      outcome = NO_EXPECTED_GROUP;
    } else if (expected && hasConsume && isTrue(gt(successes, 1L))) {
      outcome = DUPLICATE;
    } else if (expected && hasConsume && isTrue(eqL(successes, 1L)) && isTrue(afterRetry)) {
      outcome = CONSUMED_AFTER_RETRY;
    } else if (expected && hasConsume && isTrue(eqL(successes, 1L))) {
      outcome = CONSUMED;
    } else if (expected && inDlq) {
      outcome = DEAD_LETTERED;
    } else if (expected
        && hasConsume
        && isTrue(offsetsConsumed)
        && !isTrue(deadTraced)
        && !failedLast) {
      outcome = TRACE_INCOMPLETE;
    } else if (expected && hasConsume && isTrue(gt(c.inFlight, 0L))) {
      outcome = IN_FLIGHT;
    } else if (expected && hasConsume && isTrue(deadTraced)) {
      outcome = DEAD_LETTERED;
    } else if (expected && hasConsume) {
      outcome = FAILED;
    } else if (expected && isTrue(offsetsConsumed)) {
      outcome = TRACE_LOST;
    } else if (expected && isTrue(gt(due, cutoff))) {
      outcome = PENDING;
    } else if (expected) {
      outcome = NOT_CONSUMED;
    } else if (ap != null && ap.pubTs != null) {
      // consumes nobody expected of a message with a Pub
      outcome = ap.pubOk && isTrue(ap.inWindow) ? UNEXPECTED_GROUP : NONE;
    } else if (isTrue(inWin)) {
      outcome = ORPHAN_CONSUME;
      orphanCheck = realId;
    } else {
      outcome = NONE;
    }
    // meet's ``keep``: expected rows, consumes nobody expected of an in-window Pub, orphans
    if (e == null && outcome == NONE) {
      return;
    }

    Object[] v = new Object[width];
    Long storeTime = pp == null ? null : pp.storeTime;
    Long sendCost = pp == null ? null : pp.sendCost;
    Long storeRef = isTrue(gt(storeTime, 0L)) ? storeTime : plus(pubTs, sendCost);
    Long eventTs = pubTs != null ? pubTs : firstTs;
    Long window =
        eventTs == null
            ? null
            : (long) Math.floor((double) eventTs / (double) windowMs) * windowMs;
    Long topicH = coalesce(pp == null ? null : pp.topicH, c == null ? null : c.cTopicH);
    Boolean keepId = keepClassified ? Boolean.TRUE : outcome != CONSUMED;

    set(v, cOutcome, outcome == NONE ? null : outcomeNames[outcome], keepId);
    set(v, cWindow, window, keepId);
    set(v, cTopic, topicH, keepId);
    set(v, cGroup, groupH, keepId);
    set(v, cClient, ck != 0 ? ck : null, keepId);
    set(v, cPubTs, pubTs, keepId);
    set(v, cMsgType, msgTypeRaw, keepId);
    set(v, cTags, pp == null ? null : pp.tagsH, keepId);
    set(v, cStore, pp == null ? null : pp.storeH, keepId);
    set(v, cQueueId, pp == null ? null : pp.queueId, keepId);
    set(v, cQueueOffset, queueOffset, keepId);
    set(v, cCommitted, committed, keepId);
    set(v, cRReconsume, rReconsume, keepId);
    set(v, cRQueueOffset, rQueueOffset, keepId);
    set(v, cRCommitted, rCommitted, keepId);
    set(v, cDlq, dlqOffset, keepId);
    set(v, cDue, due, keepId);
    set(v, cAttempts, attempts == null ? 0L : attempts, keepId);
    set(v, cSuccesses, successes == null ? 0L : successes, keepId);
    set(v, cFailed, c == null || c.failedAttempts == null ? 0L : c.failedAttempts, keepId);
    set(v, cInFlight, c == null || c.inFlight == null ? 0L : c.inFlight, keepId);
    set(v, cMaxRetry, maxRetry, keepId);
    set(v, cMaxFailedRetry, maxFailedRetry, keepId);
    set(v, cEvents, c == null || c.consumeEvents == null ? 0L : c.consumeEvents, keepId);
    set(v, cFirstTs, firstTs, keepId);
    set(v, cSuccessTs, c == null ? null : c.successTs, keepId);
    set(v, cSendCost, sendCost, keepId);
    set(v, cStoreToConsume, minus(c == null ? null : c.firstBeforeTs, storeRef), keepId);
    set(v, cConsumeCost, c == null ? null : c.successCost, keepId);
    set(v, cE2e, minus(c == null ? null : c.successTs, pubTs), keepId);
    set(v, cMsgId, realId && isTrue(keepId) ? pkey : null, keepId);
    set(v, cTagsS, pp == null ? null : pp.tags, keepId);
    set(v, cKeys, pp == null ? null : pp.keys, keepId);
    set(v, cStoreAddr, pp == null ? null : pp.storeAddr, keepId);
    set(v, cProducerGroup, pp == null ? null : pp.producerGroup, keepId);
    set(v, cOrphanCheck, orphanCheck, keepId);
    if (tally != null && outcome != NONE && outcome != ORPHAN_CONSUME) {
      // (orphans are filtered and folded after the co-group: Spark tallies them)
      Long[] values = metricValues;
      for (int m = 0; m < values.length; m++) {
        values[m] = (Long) v[cMetrics[m]];
      }
      // (the task's own copy of the accumulator: Spark deserializes one per task)
      tally.count((Long) v[cWindow], (Long) v[cTopic], (Long) v[cGroup], outcome, values);
    }
    if (tally != null && !keepClassified && (outcome == CONSUMED || isInformational(outcome))) {
      // counted: nothing after the co-group reads a CONSUMED row, or one of an informational
      // outcome (params.INFORMATIONAL: more of them than anomalies), but the tally
      return;
    }
    out.add(new GenericInternalRow(v));
  }

  /** params.INFORMATIONAL: counted, neither anomalies nor CONSUMED. */
  static boolean isInformational(int outcome) {
    return outcome == RECALLED
        || outcome == ROLLED_BACK
        || outcome == TX_UNRESOLVED
        || outcome == NO_EXPECTED_GROUP;
  }

  /** One output value, as its column's type; left null (CONSUMED rows without
   * --keep-classified) where the tally does not read it. */
  void set(Object[] v, int i, Object x, Boolean keepId) {
    if (i < 0 || x == null) {
      return;
    }
    if (!keepClassified && !tallied[i] && !isTrue(keepId)) {
      return;
    }
    switch (kind[i]) {
      case 0:
        v[i] = ((Number) x).longValue();
        break;
      case 1:
        v[i] = ((Number) x).intValue();
        break;
      default:
        v[i] = x;
    }
  }
}

package io.tracemq.spark;

import java.util.HashMap;
import java.util.Iterator;

import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.function.FlatMapFunction2;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The anomalies' producer strings ({@code tracemq_spark.outputs.pub_details}) joined to the
 * anomaly rows in one pass per task: the Pub rows of a task's msgIds go into a hash map that
 * keeps, per msgId, the least (failed, ts, tags, keys, store address, producer group) in
 * Spark's order of a struct (nulls first, strings by their bytes) — what {@code min} of that
 * struct gives — and each anomaly row gets its msgId's strings (null without one: a left
 * join). Spark's plan for the same, a sort aggregate (partial and final: {@code min} of a
 * struct of strings has no hash aggregate) and a shuffled hash join, sorted the Pub rows
 * twice and built a hash relation of the aggregate (issue 19 goal 4, twelfth pass).
 * The DataFrame path is the reference; {@code tests/spark/test_outputs.py} holds the two to
 * each other.
 */
public final class Details {
  private Details() {}

  /** the Pub side's columns: msg_id, failed, ts, then the four strings */
  static final int P_ID = 0, P_FAILED = 1, P_TS = 2, P_STRINGS = 3, N_STRINGS = 4;

  /**
   * {@code anomalies}' rows, each followed by its msgId's four strings (tags, keys,
   * store_addr, producer_group; {@code schemaJson}: the anomalies' schema and those four).
   * Both inputs must be hash-partitioned alike by the msgId (Spark's {@code repartition(n,
   * "msg_id")} of each: partition i of one holds the msgIds of partition i of the other);
   * {@code pubs}' columns as {@link #P_ID} and the following say.
   *
   * @param idCol the index of the anomalies' msg_id column
   */
  public static Dataset<Row> join(
      Dataset<Row> anomalies, Dataset<Row> pubs, int idCol, String schemaJson) {
    StructType schema = (StructType) DataType.fromJson(schemaJson);
    JavaRDD<InternalRow> a = anomalies.queryExecution().toRdd().toJavaRDD();
    JavaRDD<InternalRow> p = pubs.queryExecution().toRdd().toJavaRDD();
    if (a.getNumPartitions() != p.getNumPartitions()) {
      throw new IllegalArgumentException(
          "partitions: " + a.getNumPartitions() + " anomalies, " + p.getNumPartitions() + " Pub");
    }
    JavaRDD<InternalRow> out = a.zipPartitions(p, new Fn(idCol, schema, pubs.schema()));
    SparkSession spark = anomalies.sparkSession();
    return spark.internalCreateDataFrame(out.rdd(), schema, false);
  }

  /** -1, 0, 1 as Spark orders two values of a field: nulls first. */
  static int nulls(InternalRow l, InternalRow r, int i) {
    boolean ln = l.isNullAt(i), rn = r.isNullAt(i);
    return ln ? (rn ? 0 : -1) : rn ? 1 : 2;
  }

  /** Whether Pub row {@code l} is less than {@code r} in the struct's order. */
  static boolean less(InternalRow l, InternalRow r) {
    int c = nulls(l, r, P_FAILED);
    if (c == 2) {
      c = Boolean.compare(l.getBoolean(P_FAILED), r.getBoolean(P_FAILED));
    }
    if (c != 0) {
      return c < 0;
    }
    c = nulls(l, r, P_TS);
    if (c == 2) {
      c = Long.compare(l.getLong(P_TS), r.getLong(P_TS));
    }
    if (c != 0) {
      return c < 0;
    }
    for (int i = P_STRINGS; i < P_STRINGS + N_STRINGS; i++) {
      c = nulls(l, r, i);
      if (c == 2) {
        c = l.getUTF8String(i).compareTo(r.getUTF8String(i));
      }
      if (c != 0) {
        return c < 0;
      }
    }
    return false;
  }

  static final class Fn
      implements FlatMapFunction2<Iterator<InternalRow>, Iterator<InternalRow>, InternalRow> {
    private static final long serialVersionUID = 1L;
    final int idCol;
    final StructType schema, pubSchema;

    Fn(int idCol, StructType schema, StructType pubSchema) {
      this.idCol = idCol;
      this.schema = schema;
      this.pubSchema = pubSchema;
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> anomalies, Iterator<InternalRow> pubs) {
      // the least Pub row of each msgId (copied: the shuffle reuses its rows; the key is the
      // copy's msgId)
      HashMap<UTF8String, UnsafeRow> best = new HashMap<>();
      // (a shuffle's rows are unsafe rows already; anything else is converted)
      UnsafeProjection unsafe = UnsafeProjection.create(pubSchema);
      while (pubs.hasNext()) {
        InternalRow r = pubs.next();
        if (r.isNullAt(P_ID)) {
          continue; // joins nothing
        }
        UnsafeRow cur = best.get(r.getUTF8String(P_ID));
        if (cur == null || less(r, cur)) {
          UnsafeRow c = (r instanceof UnsafeRow ? (UnsafeRow) r : unsafe.apply(r)).copy();
          best.put(c.getUTF8String(P_ID), c);
        }
      }
      UnsafeProjection proj = UnsafeProjection.create(schema);
      JoinedRow joined = new JoinedRow();
      GenericInternalRow strings = new GenericInternalRow(N_STRINGS);
      return new Iterator<InternalRow>() {
        @Override
        public boolean hasNext() {
          return anomalies.hasNext();
        }

        @Override
        public InternalRow next() {
          InternalRow r = anomalies.next();
          UnsafeRow b = r.isNullAt(idCol) ? null : best.get(r.getUTF8String(idCol));
          for (int i = 0; i < N_STRINGS; i++) {
            strings.update(
                i, b == null || b.isNullAt(P_STRINGS + i) ? null : b.getUTF8String(P_STRINGS + i));
          }
          return proj.apply(joined.apply(r, strings));
        }
      };
    }
  }
}

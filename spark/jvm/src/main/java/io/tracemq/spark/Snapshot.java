package io.tracemq.spark;

import java.io.IOException;
import java.io.InputStream;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.hadoop.ParquetFileWriter;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.api.WriteSupport;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;
import org.apache.parquet.hadoop.util.HadoopOutputFile;
import org.apache.parquet.io.OutputFile;
import org.apache.parquet.io.api.Binary;
import org.apache.parquet.io.api.RecordConsumer;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.MessageTypeParser;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.XXH64;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The committed-offsets snapshot ({@code {"offsets": [...], "copies": [...]}}, 650 MB at 10M
 * messages) read with Jackson's streaming parser on the driver's JVM, instead of CPython's
 * {@code json.loads} and loops (~20 s of the driver's CPU at 10M, competing with the pre-flight
 * scan for the two cores).
 *
 * <p>It computes what {@code tracemq_spark.input_files} computes — {@code parse_offsets}'s rows
 * (handed back as JSON; the Python side keeps the highest offset of a key and sorts), the
 * distinct copies' count of {@code parse_copies} and {@code last_deliveries} (kept here and
 * written as the Parquet file {@code classify.deliveries_frame} writes) — but only for a
 * document of the exact shape the exporter writes: a string where a string is expected, a
 * 64-bit integer where an integer is. Anything else (malformed, or merely unusual input that
 * Python's {@code str()}/{@code int()} would still accept) throws {@link Unsupported}, and the
 * Python parser reads the file: it is the reference, and its errors name the file and the row.
 */
public final class Snapshot {
  /** A document the strict reader does not take: the Python parser decides. */
  public static final class Unsupported extends RuntimeException {
    private static final long serialVersionUID = 1L;

    Unsupported(String why) {
      super(why);
    }
  }

  static final String RETRY = "%RETRY%", DLQ = "%DLQ%";
  /** a value that is neither a string, a 64-bit integer nor null */
  private static final Object OTHER = new Object();

  /** a retry or dead-letter copy (a record: equal copies are one, as parse_copies' set) */
  record Copy(
      String group,
      String topic,
      String store,
      long queueId,
      long queueOffset,
      String msgId,
      long reconsume) {}

  record Key(String msgId, String group) {}

  record QueueKey(String group, String topic, String store, long queueId) {}

  /** (group, topic, store_addr, queue_id, client, committed) of every row with a committed */
  private final List<Object[]> offsetRows = new ArrayList<>();
  /**
   * 64-bit fingerprints of the copies read, to count them as parse_copies' set does (a copy
   * read twice is one), in a primitive open-addressing table: the set of Copy records it
   * replaces kept 2.6M of them (and their msgIds) live through the read at 10M messages. A
   * copy read twice changes neither its message's last retry copy nor its lowest dead-letter
   * offset, so every copy row is applied; the fingerprints only count (two distinct copies
   * with one fingerprint, ~1 in 10^7 at that size, would make the count one short).
   */
  private long[] seen = new long[1 << 12];

  private int nCopies;
  /** per (msgId, group): the retry copy with the highest (reconsume count, queue offset) */
  private final Map<Key, Copy> last = new HashMap<>();
  /** per (msgId, group): the lowest dead-letter copy's queue offset */
  private final Map<Key, Long> dlq = new HashMap<>();

  /** the strings read (groups, topics, store addresses, clients), one instance each */
  private final Map<String, String> pool = new HashMap<>();

  private Snapshot() {}

  /** Reads the snapshot at {@code uri} (any Hadoop file system); {@link Unsupported} if it is
   * not of the exporter's shape. */
  public static Snapshot read(String uri, Configuration conf) throws IOException {
    Path path = new Path(uri);
    FileSystem fs = path.getFileSystem(conf);
    Snapshot s = new Snapshot();
    try (InputStream in = fs.open(path);
        JsonParser p = new JsonFactory().createParser(in)) {
      s.parse(p);
    }
    // (let go of what is no longer needed: it would stay live through the job's collections)
    s.seen = null;
    s.pool.clear();
    return s;
  }

  private void parse(JsonParser p) throws IOException {
    if (p.nextToken() != JsonToken.START_OBJECT) {
      throw new Unsupported("not a JSON object");
    }
    boolean sawOffsets = false, sawCopies = false;
    while (p.nextToken() == JsonToken.FIELD_NAME) {
      String name = p.currentName();
      JsonToken t = p.nextToken();
      if ("offsets".equals(name)) {
        if (sawOffsets || t != JsonToken.START_ARRAY) {
          throw new Unsupported("offsets: not one list");
        }
        sawOffsets = true;
        Object[] row = new Object[N_FIELDS];
        while (readRow(p, row)) {
          offsetRow(row);
        }
      } else if ("copies".equals(name)) {
        if (sawCopies || (t != JsonToken.START_ARRAY && t != JsonToken.VALUE_NULL)) {
          throw new Unsupported("copies: not one list");
        }
        sawCopies = true;
        if (t == JsonToken.START_ARRAY) {
          Object[] row = new Object[N_FIELDS];
          while (readRow(p, row)) {
            copyRow(row);
          }
        }
      } else {
        p.skipChildren();
      }
    }
    if (!sawOffsets) {
      throw new Unsupported("no offsets list");
    }
    if (p.nextToken() != null) {
      throw new Unsupported("trailing data");
    }
  }

  // the fields read (others are skipped, as the Python parser ignores them)
  static final int GROUP = 0, TOPIC = 1, STORE = 2, QUEUE_ID = 3, COMMITTED = 4, CLIENT = 5;
  static final int QUEUE_OFFSET = 6, MSG_ID = 7, RECONSUME = 8, N_FIELDS = 9;
  static final String[] FIELDS = {
    "group", "topic", "store_addr", "queue_id", "committed", "client_host", "queue_offset",
    "msg_id", "reconsume_times"
  };

  private static int field(String name) {
    switch (name) {
      case "group":
        return GROUP;
      case "topic":
        return TOPIC;
      case "store_addr":
        return STORE;
      case "queue_id":
        return QUEUE_ID;
      case "committed":
        return COMMITTED;
      case "client_host":
        return CLIENT;
      case "queue_offset":
        return QUEUE_OFFSET;
      case "msg_id":
        return MSG_ID;
      case "reconsume_times":
        return RECONSUME;
      default:
        return -1;
    }
  }

  /** The next object of a list into {@code row} (missing and null: null; a key given twice:
   * the last value, as Python's json); false at the list's end. */
  private boolean readRow(JsonParser p, Object[] row) throws IOException {
    JsonToken t = p.nextToken();
    if (t == JsonToken.END_ARRAY) {
      return false;
    }
    if (t != JsonToken.START_OBJECT) {
      throw new Unsupported("a list item is not an object");
    }
    Arrays.fill(row, null);
    while (p.nextToken() == JsonToken.FIELD_NAME) {
      int f = field(p.currentName());
      JsonToken v = p.nextToken();
      if (f < 0) {
        p.skipChildren();
        continue;
      }
      Object value;
      if (v == JsonToken.VALUE_STRING) {
        // (every value but the msgId repeats: one String each, not one per row)
        value = f == MSG_ID ? p.getText() : pool.computeIfAbsent(p.getText(), x -> x);
      } else if (v == JsonToken.VALUE_NULL) {
        value = null;
      } else if (v == JsonToken.VALUE_NUMBER_INT
          && p.getNumberType() != JsonParser.NumberType.BIG_INTEGER) {
        value = p.getLongValue();
      } else {
        p.skipChildren();
        value = OTHER;
      }
      row[f] = value;
    }
    return true;
  }

  private static String str(Object[] row, int f) {
    if (row[f] instanceof String s) {
      return s;
    }
    throw new Unsupported(FIELDS[f] + " is not a string");
  }

  private static long integer(Object[] row, int f) {
    if (row[f] instanceof Long v) {
      return v;
    }
    throw new Unsupported(FIELDS[f] + " is not an integer");
  }

  /** {@code x or default}: missing, null or "" give the default */
  private static String strOr(Object[] row, int f, String dflt) {
    Object v = row[f];
    if (v == null || "".equals(v)) {
      return dflt;
    }
    if (v instanceof String s) {
      return s;
    }
    throw new Unsupported(FIELDS[f] + " is not a string");
  }

  /** {@code int(x or 0)} */
  private static long intOr0(Object[] row, int f) {
    Object v = row[f];
    if (v == null) {
      return 0;
    }
    if (v instanceof Long l) {
      return l;
    }
    throw new Unsupported(FIELDS[f] + " is not an integer");
  }

  private static long int32(long v, String what) {
    if (v != (int) v) {
      throw new Unsupported(what + " out of the int range");
    }
    return v;
  }

  private void offsetRow(Object[] row) {
    if (row[COMMITTED] == null) {
      return; // (as parse_offsets: no committed offset, whatever else the row holds)
    }
    offsetRows.add(
        new Object[] {
          str(row, GROUP),
          str(row, TOPIC),
          str(row, STORE),
          int32(integer(row, QUEUE_ID), "queue_id"),
          strOr(row, CLIENT, ""),
          integer(row, COMMITTED)
        });
  }

  private void copyRow(Object[] row) {
    String topic = str(row, TOPIC);
    String prefix;
    if (topic.startsWith(RETRY)) {
      prefix = RETRY;
    } else if (topic.startsWith(DLQ)) {
      prefix = DLQ;
    } else {
      throw new Unsupported("a copy of topic " + topic);
    }
    Object id = row[MSG_ID];
    if (id == null || "".equals(id)) {
      return;
    }
    if (!(id instanceof String)) {
      throw new Unsupported("msg_id is not a string");
    }
    Object g = row[GROUP];
    String group =
        g == null || "".equals(g)
            ? pool.computeIfAbsent(topic.substring(prefix.length()), x -> x)
            : str(row, GROUP);
    Copy c =
        new Copy(
            group,
            topic,
            str(row, STORE),
            integer(row, QUEUE_ID),
            integer(row, QUEUE_OFFSET),
            (String) id,
            int32(intOr0(row, RECONSUME), "reconsume_times"));
    count(c);
    Key key = new Key(c.msgId(), c.group());
    if (prefix == DLQ) {
      Long old = dlq.get(key);
      if (old == null || c.queueOffset() < old) {
        dlq.put(key, c.queueOffset());
      }
      return;
    }
    Copy prev = last.get(key);
    if (prev == null
        || c.reconsume() > prev.reconsume()
        || (c.reconsume() == prev.reconsume() && c.queueOffset() > prev.queueOffset())) {
      last.put(key, c);
    }
  }

  /** Counts ``c`` unless its fingerprint was seen (see {@link #seen}). */
  private void count(Copy c) {
    long f =
        mix(
            mix(mix(mix(mix(mix(fnv(c.group()), fnv(c.topic())), fnv(c.store())), c.queueId()),
                c.queueOffset()),
                fnv(c.msgId())),
            c.reconsume());
    if (f == 0) {
      f = 1; // (0 marks an empty slot)
    }
    if (2 * (nCopies + 1) > seen.length) {
      long[] old = seen;
      seen = new long[old.length * 2];
      for (long x : old) {
        if (x != 0) {
          put(x);
        }
      }
    }
    if (put(f)) {
      nCopies++;
    }
  }

  /** ``f`` into {@link #seen}; false if it was there. */
  private boolean put(long f) {
    int m = seen.length - 1;
    int i = (int) (f ^ (f >>> 32)) & m;
    while (seen[i] != 0) {
      if (seen[i] == f) {
        return false;
      }
      i = (i + 1) & m;
    }
    seen[i] = f;
    return true;
  }

  /** FNV-1a, 64 bits, over a string's chars */
  private static long fnv(String x) {
    long h = 0xcbf29ce484222325L;
    for (int i = 0; i < x.length(); i++) {
      h = (h ^ x.charAt(i)) * 0x100000001b3L;
    }
    return h;
  }

  private static long mix(long h, long v) {
    h = (h ^ v) * 0xbf58476d1ce4e5b9L;
    return h ^ (h >>> 31);
  }

  // ---- what the Python side reads --------------------------------------------------------

  /** The rows with a committed offset, as a JSON list of [group, topic, store_addr, queue_id,
   * client, committed] (few: one per group and queue). */
  public String offsetsJson() throws IOException {
    StringWriter w = new StringWriter();
    try (JsonGenerator g = new JsonFactory().createGenerator(w)) {
      g.writeStartArray();
      for (Object[] r : offsetRows) {
        g.writeStartArray();
        g.writeString((String) r[0]);
        g.writeString((String) r[1]);
        g.writeString((String) r[2]);
        g.writeNumber((Long) r[3]);
        g.writeString((String) r[4]);
        g.writeNumber((Long) r[5]);
        g.writeEndArray();
      }
      g.writeEndArray();
    }
    return w.toString();
  }

  /** distinct copies read (parse_copies' length) */
  public int copies() {
    return nCopies;
  }

  /** last deliveries: one per (msgId, group) with a retry or a dead-letter copy */
  public int deliveries() {
    int n = last.size();
    for (Key k : dlq.keySet()) {
      if (!last.containsKey(k)) {
        n++;
      }
    }
    return n;
  }

  static final MessageType DELIVERY_SCHEMA =
      MessageTypeParser.parseMessageType(
          "message deliveries {"
              + " optional binary d_pkey (STRING);"
              + " optional binary group (STRING);"
              + " optional int32 retry_reconsume;"
              + " optional int64 retry_queue_offset;"
              + " optional int64 retry_committed;"
              + " optional int64 dlq_queue_offset; }");

  /** The deliveries file's row groups (~15 000 rows each). */
  static final long DELIVERY_ROW_GROUP_BYTES = 1L << 20;

  /**
   * Writes the last deliveries (input_files.last_deliveries' rows, the columns of
   * classify.deliveries_frame's file) to the Parquet file {@code file}: the last retry copy's
   * reconsume count, queue offset and its queue's committed offset (of the clustering rows,
   * the highest of a key), the dead-letter copy's queue offset.
   */
  public void writeDeliveries(String file, Configuration conf) throws IOException {
    Map<QueueKey, Long> committed = committedOffsets();
    Set<Key> keySet = new LinkedHashSet<>(last.keySet());
    keySet.addAll(dlq.keySet());
    // in msgId order, in small row groups: a read of one msgId range (Ranges) skips the rest
    Key[] keys = sortedByMsgId(keySet);
    try (ParquetWriter<Object[]> w =
        new DeliveryWriter(HadoopOutputFile.fromPath(new Path(file), conf))
            .withConf(conf)
            .withRowGroupSize(DELIVERY_ROW_GROUP_BYTES)
            .withCompressionCodec(CompressionCodecName.SNAPPY)
            // (a msgId a row: a dictionary would only be tried and dropped)
            .withDictionaryEncoding("d_pkey", false)
            .withWriteMode(ParquetFileWriter.Mode.OVERWRITE)
            .build()) {
      Object[] row = new Object[6];
      for (Key k : keys) {
        Arrays.fill(row, null);
        row[0] = k.msgId();
        row[1] = k.group();
        Copy c = last.get(k);
        if (c != null) {
          row[2] = (int) c.reconsume();
          row[3] = c.queueOffset();
          row[4] = committed.get(new QueueKey(c.group(), c.topic(), c.store(), c.queueId()));
        }
        row[5] = dlq.get(k);
        w.write(row);
      }
    }
    // written once (JvmSnapshot.frame): nothing of it is needed any more
    last.clear();
    dlq.clear();
  }

  /** each queue's committed offset (of the clustering rows: the highest of a key) */
  private Map<QueueKey, Long> committedOffsets() {
    Map<QueueKey, Long> committed = new HashMap<>();
    for (Object[] r : offsetRows) {
      if (!((String) r[4]).isEmpty()) {
        continue;
      }
      committed.merge(
          new QueueKey((String) r[0], (String) r[1], (String) r[2], (Long) r[3]),
          (Long) r[5],
          Math::max);
    }
    return committed;
  }

  /**
   * The last deliveries as the co-group's input rows ({@code classify.delivery_side}'s: the
   * columns of {@code classify.COGROUP_COLS}, {@code inputSchemaJson}; side 2; those without a
   * msgId dropped), split by the msgId ranges {@code bounds} ({@link Ranges#plan}): per range,
   * its rows as unsafe rows' bytes, each after its length ({@link Cogroup#deliveryRanges} reads
   * them). What the classification by range reads instead of {@link #writeDeliveries}' file: no
   * sort, no Parquet write and read, no plans per range (at 10M messages ~3 – 5 s of the
   * driver's CPU between the pre-flight and the first co-group task). Once: it lets go of the
   * deliveries, as {@link #writeDeliveries}.
   */
  public byte[][] rangeRows(String[] bounds, String inputSchemaJson) throws IOException {
    Map<QueueKey, Long> committed = committedOffsets();
    Set<Key> keySet = new LinkedHashSet<>(last.keySet());
    keySet.addAll(dlq.keySet());
    byte[][] edges = new byte[bounds.length][];
    for (int i = 0; i < bounds.length; i++) {
      edges[i] = bounds[i].getBytes(StandardCharsets.UTF_8);
    }
    StructType schema = (StructType) DataType.fromJson(inputSchemaJson);
    UnsafeProjection unsafe = UnsafeProjection.create(schema);
    GenericInternalRow row = new GenericInternalRow(schema.size());
    java.io.ByteArrayOutputStream[] bufs = new java.io.ByteArrayOutputStream[bounds.length + 1];
    java.io.DataOutputStream[] outs = new java.io.DataOutputStream[bufs.length];
    for (int i = 0; i < bufs.length; i++) {
      bufs[i] = new java.io.ByteArrayOutputStream(1 << 16);
      outs[i] = new java.io.DataOutputStream(bufs[i]);
    }
    for (Key k : keySet) {
      if (k.msgId() == null) {
        continue; // (meets nothing: the joins' null keys)
      }
      byte[] id = k.msgId().getBytes(StandardCharsets.UTF_8);
      // the range: the first whose upper bound is above the msgId, as UTF-8 bytes (Spark's
      // order of strings, the ranges' conditions')
      int lo = 0, hi = edges.length;
      while (lo < hi) {
        int mid = (lo + hi) >>> 1;
        if (Arrays.compareUnsigned(edges[mid], id) <= 0) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      for (int f = 0; f < schema.size(); f++) {
        row.setNullAt(f);
      }
      row.update(Cogroup.PKEY, UTF8String.fromBytes(id));
      row.setLong(Cogroup.K, XXH64.hashUnsafeBytes(id, Platform.BYTE_ARRAY_OFFSET, id.length, 42));
      row.setInt(Cogroup.SIDE, Cogroup.SIDE_DELIVERY);
      if (k.group() != null) {
        byte[] g = k.group().getBytes(StandardCharsets.UTF_8);
        row.setLong(Cogroup.L1, XXH64.hashUnsafeBytes(g, Platform.BYTE_ARRAY_OFFSET, g.length, 42));
      }
      Copy c = last.get(k);
      if (c != null) {
        row.setInt(Cogroup.I1, (int) c.reconsume());
        row.setLong(Cogroup.L2, c.queueOffset());
        Long done = committed.get(new QueueKey(c.group(), c.topic(), c.store(), c.queueId()));
        if (done != null) {
          row.setLong(Cogroup.L3, done);
        }
      }
      Long dead = dlq.get(k);
      if (dead != null) {
        row.setLong(Cogroup.L4, dead);
      }
      UnsafeRow u = unsafe.apply(row);
      outs[lo].writeInt(u.getSizeInBytes());
      u.writeToStream(outs[lo], null);
    }
    byte[][] out = new byte[bufs.length][];
    for (int i = 0; i < bufs.length; i++) {
      outs[i].flush();
      out[i] = bufs[i].toByteArray();
      bufs[i] = null;
    }
    // split once (JvmSnapshot.split): nothing of them is needed any more (~0.3 GB at 10M
    // messages, which the co-group's tasks would otherwise share the heap with)
    last.clear();
    dlq.clear();
    return out;
  }

  /** A row of {@link #DELIVERY_SCHEMA} (String, String, Integer, Long, Long, Long; null:
   * absent) straight to Parquet's record consumer. */
  /**
   * {@code keys} by msgId, then group (nulls first), the msgIds compared as UTF-8 bytes: Spark's
   * and Parquet's order, which the ranges' conditions and the row groups' statistics use (and
   * {@code classify.deliveries_frame}'s). Each msgId's bytes are copied next to its entry first:
   * compared where they were, the keys' strings lay scattered over the heap the parse left, and
   * the sort waited on memory (~1.5 – 2.3 s for 0.9M keys at 10M messages).
   */
  static Key[] sortedByMsgId(Collection<Key> keys) {
    Entry[] es = new Entry[keys.size()];
    int i = 0;
    for (Key k : keys) {
      es[i++] = new Entry(k.msgId() == null ? null : k.msgId().getBytes(StandardCharsets.UTF_8), k);
    }
    Arrays.sort(es, Snapshot::byId);
    Key[] out = new Key[es.length];
    for (i = 0; i < es.length; i++) {
      out[i] = es[i].key();
    }
    return out;
  }

  /** a key and its msgId's UTF-8 bytes, for {@link #sortedByMsgId} */
  record Entry(byte[] id, Key key) {}

  static int byId(Entry a, Entry b) {
    int c;
    if (a.id() == null || b.id() == null) {
      c = a.id() == null ? (b.id() == null ? 0 : -1) : 1;
    } else {
      c = Arrays.compareUnsigned(a.id(), b.id());
    }
    return c != 0 ? c : nullsFirst(a.key().group(), b.key().group());
  }

  static int nullsFirst(String a, String b) {
    if (a == null || b == null) {
      return a == null ? (b == null ? 0 : -1) : 1;
    }
    return a.compareTo(b);
  }

  static final class DeliveryWriteSupport extends WriteSupport<Object[]> {
    private RecordConsumer out;

    @Override
    @SuppressWarnings("deprecation") // (the abstract one; its ParquetConfiguration twin calls it)
    public WriteContext init(Configuration conf) {
      return new WriteContext(DELIVERY_SCHEMA, new HashMap<>());
    }

    @Override
    public void prepareForWrite(RecordConsumer recordConsumer) {
      out = recordConsumer;
    }

    @Override
    public void write(Object[] row) {
      out.startMessage();
      for (int i = 0; i < row.length; i++) {
        Object v = row[i];
        if (v == null) {
          continue;
        }
        String name = DELIVERY_SCHEMA.getFieldName(i);
        out.startField(name, i);
        if (v instanceof String str) {
          out.addBinary(Binary.fromString(str));
        } else if (v instanceof Integer n) {
          out.addInteger(n);
        } else {
          out.addLong((Long) v);
        }
        out.endField(name, i);
      }
      out.endMessage();
    }
  }

  static final class DeliveryWriter extends ParquetWriter.Builder<Object[], DeliveryWriter> {
    DeliveryWriter(OutputFile file) {
      super(file);
    }

    @Override
    protected DeliveryWriter self() {
      return this;
    }

    @Override
    @SuppressWarnings("deprecation") // (the abstract one, as above)
    protected WriteSupport<Object[]> getWriteSupport(Configuration conf) {
      return new DeliveryWriteSupport();
    }
  }

  @Override
  public String toString() {
    return "Snapshot(" + offsetRows.size() + " offsets, " + nCopies + " copies)";
  }
}

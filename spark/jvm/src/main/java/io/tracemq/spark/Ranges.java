package io.tracemq.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.column.statistics.Statistics;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ColumnChunkMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.hadoop.util.HadoopInputFile;
import org.apache.parquet.io.api.Binary;
import org.apache.parquet.schema.MessageType;

/**
 * msgId ranges that split the lake's rows into tasks without a shuffle (issue 19 goal 4).
 *
 * <p>The collector writes every lake file with its rows sorted by msgId in small row groups
 * ({@code tracemq_collector.lake.FILE_SORT_KEYS}, {@code ROW_GROUP_ROWS}), so a read of the
 * rows of one msgId range skips, by the row groups' statistics, all of a file but the row
 * groups that range touches. {@link #plan} reads the files' footers and, when every file is
 * sorted so, gives the boundaries of {@code n} ranges of about equal rows: the co-group then
 * reads each range in one task ({@link Cogroup#classifyRanges}) and needs no exchange. A file
 * that is not sorted by msgId (or has no statistics for it) makes {@link #plan} give null: the
 * job shuffles by the msgId's hash as before, and so does a plan whose ranges would read more
 * than {@link #READ_FACTOR} times the rows (row groups across boundaries are read by each
 * range they touch). The boundaries decide only how the rows are
 * split; which rows a range holds is decided by comparing each row's msgId (Spark's filter),
 * so any boundaries give the same classification.
 */
public final class Ranges {
  private Ranges() {}

  /** The column the ranges split. */
  static final String COLUMN = "msg_id";

  /** No boundary at or below this: keys that start with U+0000 (the consume rows without a
   * msgId: {@code classify._consume_side}'s pkey) and the empty msgId stay in the first range
   * with the rows whose msgId is null. */
  static final byte[] FLOOR = {0x01};

  /**
   * The boundaries (ascending, distinct, each above {@link #FLOOR}) of at most {@code n} msgId
   * ranges over {@code files}, or null when a file's rows are not sorted by msgId by its row
   * groups' statistics, or there is nothing to split.
   */
  public static String[] plan(String[] files, Configuration conf, int n) throws IOException {
    List<long[]> sizes = new ArrayList<>(); // (index into mins, rows)
    List<byte[]> mins = new ArrayList<>();
    List<byte[]> maxs = new ArrayList<>();
    long total = 0;
    for (String f : files) {
      ParquetMetadata footer;
      try (ParquetFileReader r =
          ParquetFileReader.open(HadoopInputFile.fromPath(new Path(f), conf))) {
        footer = r.getFooter();
      }
      long[] rows = new long[1];
      if (!sortedGroups(footer, rows, sizes, mins, maxs)) {
        return null;
      }
      total += rows[0];
    }
    if (n < 2 || mins.isEmpty()) {
      return null;
    }
    // the row groups by their least msgId; a boundary at a group's least msgId wherever the
    // rows before it pass the next n-th of the whole
    Integer[] order = new Integer[mins.size()];
    for (int i = 0; i < order.length; i++) {
      order[i] = i;
    }
    Arrays.sort(order, (a, b) -> Arrays.compareUnsigned(mins.get(a), mins.get(b)));
    List<String> out = new ArrayList<>();
    byte[] last = FLOOR;
    long before = 0;
    int k = 1;
    for (Integer i : order) {
      byte[] m = mins.get(i);
      if (k < n && before >= total * k / n && Arrays.compareUnsigned(m, last) > 0) {
        String s = utf8(m);
        if (s != null) {
          out.add(s);
          last = m;
          while (k < n && before >= total * k / n) {
            k++;
          }
        }
      }
      before += sizes.get(i)[1];
    }
    if (out.isEmpty()) {
      return null;
    }
    // the rows the ranges would read: a row group across k boundaries is read by k + 1 ranges
    // (a file written unsorted in one row group by another tool passes the order check and
    // spans them all): past READ_FACTOR times the rows, the shuffle is the cheaper read
    byte[][] bs = new byte[out.size()][];
    for (int i = 0; i < bs.length; i++) {
      bs[i] = out.get(i).getBytes(StandardCharsets.UTF_8);
    }
    double read = 0;
    for (long[] g : sizes) {
      int idx = (int) g[0];
      read += (double) g[1] * (1 + below(bs, maxs.get(idx)) - below(bs, mins.get(idx)));
    }
    return read <= READ_FACTOR * total ? out.toArray(new String[0]) : null;
  }

  /**
   * At most this many times the rows read by all ranges together, else no ranges. Measured at
   * 10M messages: the hash shuffle costs ~0.33 µs of task CPU per row (written and read back),
   * a row read again ~0.5 µs; the ranges read 1.08 times the rows.
   */
  static final double READ_FACTOR = 1.5;

  /** How many of the ascending {@code bounds} are at or below {@code v}. */
  static int below(byte[][] bounds, byte[] v) {
    int n = 0;
    while (n < bounds.length && Arrays.compareUnsigned(bounds[n], v) <= 0) {
      n++;
    }
    return n;
  }

  /**
   * Whether the file's row groups are in msgId order: each group's least msgId at or above the
   * previous group's greatest, the groups without a msgId (all null, sorted last) after all
   * the others. Adds each group with a msgId to {@code sizes} (index into {@code mins}, rows)
   * {@code mins} and {@code maxs} (its least and greatest msgId), and the file's rows to
   * {@code rows[0]}.
   */
  static boolean sortedGroups(
      ParquetMetadata footer,
      long[] rows,
      List<long[]> sizes,
      List<byte[]> mins,
      List<byte[]> maxs) {
    MessageType schema = footer.getFileMetaData().getSchema();
    if (!schema.containsField(COLUMN)) {
      return false;
    }
    int index = schema.getFieldIndex(COLUMN);
    byte[] prevMax = null;
    boolean nullsOnly = false;
    for (BlockMetaData block : footer.getBlocks()) {
      long n = block.getRowCount();
      rows[0] += n;
      if (n == 0) {
        continue;
      }
      ColumnChunkMetaData c = block.getColumns().get(index);
      Statistics<?> st = c.getStatistics();
      if (st == null || st.isEmpty()) {
        return false;
      }
      if (!st.hasNonNullValue()) {
        nullsOnly = true; // (only nulls: every later group must be so too)
        continue;
      }
      if (nullsOnly) {
        return false;
      }
      byte[] lo = ((Binary) st.genericGetMin()).getBytes();
      byte[] hi = ((Binary) st.genericGetMax()).getBytes();
      if (prevMax != null && Arrays.compareUnsigned(lo, prevMax) < 0) {
        return false;
      }
      prevMax = hi;
      sizes.add(new long[] {mins.size(), n});
      mins.add(lo);
      maxs.add(hi);
    }
    return true;
  }

  /** {@code b} as a string when it is well-formed UTF-8 (a boundary must compare as its
   * bytes do), else null. */
  static String utf8(byte[] b) {
    String s = new String(b, StandardCharsets.UTF_8);
    return Arrays.equals(s.getBytes(StandardCharsets.UTF_8), b) ? s : null;
  }
}

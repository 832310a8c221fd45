package io.tracemq.spark;

import java.io.IOException;
import java.io.StringWriter;
import java.util.HashMap;
import java.util.Map;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.column.statistics.Statistics;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.hadoop.util.HadoopInputFile;
import org.apache.parquet.schema.MessageType;

/**
 * What a lake file's footer says, in one call ({@code tracemq_spark.fs.HadoopFS
 * .parquet_footers}): walking a footer's row groups through py4j cost a round trip per row
 * group and column — seconds over a lake of the collector's 8192-row groups.
 */
public final class Footers {
  private Footers() {}

  /**
   * The footer of {@code uri} as JSON: {@code {"kv": {key: value or null}, "rows": n,
   * "ranges": {column: [min, max] or null}}} — the key-value metadata {@code keys}, the row
   * count, and for each integer column of {@code ranged} its values' range by the row groups'
   * statistics (null when the column is absent or a non-empty row group has no statistics or
   * only nulls). Throws the reader's error for a file that is not Parquet.
   */
  public static String read(String uri, Configuration conf, String[] keys, String[] ranged)
      throws IOException {
    ParquetMetadata footer;
    try (ParquetFileReader r =
        ParquetFileReader.open(HadoopInputFile.fromPath(new Path(uri), conf))) {
      footer = r.getFooter();
    }
    Map<String, String> kv = footer.getFileMetaData().getKeyValueMetaData();
    MessageType schema = footer.getFileMetaData().getSchema();
    int m = ranged.length;
    int[] index = new int[m];
    boolean[] complete = new boolean[m];
    boolean[] seen = new boolean[m];
    long[] lo = new long[m];
    long[] hi = new long[m];
    for (int i = 0; i < m; i++) {
      complete[i] = schema.containsField(ranged[i]);
      index[i] = complete[i] ? schema.getFieldIndex(ranged[i]) : -1;
    }
    long rows = 0;
    for (BlockMetaData block : footer.getBlocks()) {
      long n = block.getRowCount();
      rows += n;
      if (n == 0) {
        continue;
      }
      for (int i = 0; i < m; i++) {
        if (!complete[i]) {
          continue;
        }
        Statistics<?> st = block.getColumns().get(index[i]).getStatistics();
        if (st == null || st.isEmpty() || !st.hasNonNullValue()) {
          complete[i] = false;
          continue;
        }
        long a = ((Number) st.genericGetMin()).longValue();
        long b = ((Number) st.genericGetMax()).longValue();
        lo[i] = seen[i] ? Math.min(lo[i], a) : a;
        hi[i] = seen[i] ? Math.max(hi[i], b) : b;
        seen[i] = true;
      }
    }
    Map<String, String> values = new HashMap<>();
    for (String k : keys) {
      values.put(k, kv.get(k));
    }
    StringWriter w = new StringWriter();
    try (JsonGenerator g = new JsonFactory().createGenerator(w)) {
      g.writeStartObject();
      g.writeObjectFieldStart("kv");
      for (String k : keys) {
        g.writeStringField(k, values.get(k));
      }
      g.writeEndObject();
      g.writeNumberField("rows", rows);
      g.writeObjectFieldStart("ranges");
      for (int i = 0; i < m; i++) {
        g.writeFieldName(ranged[i]);
        if (complete[i] && seen[i]) {
          g.writeStartArray();
          g.writeNumber(lo[i]);
          g.writeNumber(hi[i]);
          g.writeEndArray();
        } else {
          g.writeNull();
        }
      }
      g.writeEndObject();
      g.writeEndObject();
    }
    return w.toString();
  }
}

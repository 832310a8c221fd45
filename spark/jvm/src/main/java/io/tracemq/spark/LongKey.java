package io.tracemq.spark;

import java.io.Serializable;
import java.util.Arrays;

/**
 * A hash-map key of a few nullable longs (hashes of strings, windows, queue ids) with a mixed
 * hash: a {@code List<Long>}'s polynomial hash left the windows (multiples of the window
 * length, 64 · 9375 ms for ten minutes) out of its low bits, so one (topic, group)'s windows
 * shared a few buckets of a map, which Java then turned into trees (JFR: {@code
 * HashMap$TreeNode.getTreeNode} under every look-up of the tally's groups).
 */
final class LongKey implements Serializable {
  private static final long serialVersionUID = 1L;
  private final Long[] v;
  private final int hash;

  LongKey(Long... v) {
    this.v = v;
    long h = 0x9E3779B97F4A7C15L;
    for (Long x : v) {
      h = (h ^ (x == null ? 0x632BE59BD9B4E019L : x)) * 0xBF58476D1CE4E5B9L;
      h ^= h >>> 31;
    }
    hash = (int) (h ^ (h >>> 32));
  }

  Long get(int i) {
    return v[i];
  }

  @Override
  public int hashCode() {
    return hash;
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof LongKey && hash == ((LongKey) o).hash && Arrays.equals(v, ((LongKey) o).v);
  }
}

"""tracemq trace collector (placeholder until the collector issue: health and metrics only)."""

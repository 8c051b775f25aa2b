"""Distribution: per-replica values, on-read variables aggregated across replicas, and
resharding variables onto new shardings."""

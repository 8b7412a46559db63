"""From results to tables: statistics, scaling efficiency, comparisons (pandas, no plotting)."""

"""What torchscale measures, apart from where it is stored: step statistics, the straggler rule,
bus bandwidth, the figures' names and definitions, and table cells as numbers."""

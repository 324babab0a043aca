"""Seeded sweeps of arms x seeds, their aggregation and reports (`sao sweep`, `sao report`, `sao compare`)."""

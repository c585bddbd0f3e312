"""Benchmarks that span stages. They sit on top: no stage imports this package."""

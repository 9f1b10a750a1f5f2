"""Straggler what-if analysis of training op traces (trace ingest, dependency model, simulator, metrics, plots)."""

"""The result record: its schema and atomic file I/O (`results`) and where a result came from (`provenance`)."""

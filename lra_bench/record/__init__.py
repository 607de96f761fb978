"""The result record: its schema and atomic file I/O (`results`), the one builder (`builder`), the experiment's
identity (`identity`) and protocol conformance (`conformance`), per-example test outputs (`predictions`) and where a
result came from (`provenance`)."""

"""The result record: its types (`schema`), its file I/O (`results`), the one builder (`builder`), the typed reader
(`reader`), the experiment's identity (`identity`) and protocol conformance (`conformance`), per-example test
outputs (`predictions`) and where a result came from (`provenance`)."""

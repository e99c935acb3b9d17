//! ingest (placeholder, filled by its issue)

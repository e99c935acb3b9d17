//! shards (placeholder, filled by its issue)

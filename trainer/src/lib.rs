//! trainer (placeholder, filled by its issue)

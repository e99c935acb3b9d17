//! pipeline (placeholder, filled by its issue)

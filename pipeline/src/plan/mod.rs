//! The planner: type-aligned, token-budget packing and rank balancing (pipeline issue).

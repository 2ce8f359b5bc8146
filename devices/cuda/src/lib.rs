//! The real-GPU executor (being written).

//! The crash suite (being written).

//! The bad-input sweep (being written).

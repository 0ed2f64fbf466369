//! The fault suite (being written).

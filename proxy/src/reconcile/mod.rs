//! Reconcilers: plain async functions run periodically and on triggers.

pub mod discovery;
pub mod qualify;
pub mod release;
pub mod targets_file;

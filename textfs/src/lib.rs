//! Helpers every csi-scsi crate may use and none of them owns, with no
//! csi-scsi dependency: text from outside cut to a bound ([`text`]), a file
//! replaced durably ([`durable`]), and wake-ups when files change
//! ([`file_watch`]).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod durable;
pub mod file_watch;
pub mod text;

pub use durable::write_durably;
pub use text::excerpt;

//! The CSI services of the proxy: Identity comes from the daemon crate;
//! Controller lives here, with request parsing and the one error mapping.

mod controller;
mod request;
mod status;

pub use controller::ControllerService;

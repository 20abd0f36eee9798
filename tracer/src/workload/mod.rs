//! Built-in workloads for `tracer demo` and the tests: a synthetic inference server and the
//! disturbances applied to it. They run as separate processes (the tracer re-executes itself
//! with a hidden subcommand), so the tracer attaches to them exactly as to a real server.

pub mod hog;
pub mod server;

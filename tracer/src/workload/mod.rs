//! The built-in workload and disturbances that `tracer demo` runs (as hidden subcommands of
//! this binary, so the demo needs nothing else installed).

pub mod disturb;
pub mod limit;
pub mod server;
pub mod work;

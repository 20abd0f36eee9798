//! Where measurements come from. Each source knows its own kernel or library interface and
//! hands plain data to the session.

pub mod cgroup;
pub mod cgroup_target;
pub mod clock;
pub mod ebpf;
pub mod gpu;
pub mod host;
pub mod latency_log;
pub mod perf;
pub mod pidns;
pub mod privileges;
pub mod process;
pub mod python;
pub mod targets;
pub mod topology;

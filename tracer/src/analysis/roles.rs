//! What each process of a service is for, told from its process title and command line: the
//! serving stacks name their processes (vLLM's `VLLM::EngineCore_DP0`, SGLang's
//! `sglang::scheduler_TP0`), and the others are known by their binaries. A process no rule
//! knows is called by its command name. Pure.

/// The role of a process with this `comm` (cut at 15 bytes by the kernel) and `cmdline`
/// (argv; a process title set with setproctitle is argv[0] as one string).
pub fn role_of(comm: &str, cmdline: &[String]) -> String {
    // A title set with setproctitle may keep the old argv's room as trailing spaces.
    let title = cmdline.first().map(|s| s.trim()).unwrap_or("");
    let line = cmdline.join(" ");
    let named = |prefix: &str| {
        title
            .strip_prefix(prefix)
            .or_else(|| comm.strip_prefix(prefix))
    };
    // vLLM v1: VLLM::APIServer, VLLM::EngineCore[_DP<n>], VLLM::Worker[_TP<n>][_PP<n>]. The
    // prefixes are short enough to match a comm cut at 15 bytes ("VLLM::EngineCor").
    if let Some(rest) = named("VLLM::") {
        return match rest {
            r if r.starts_with("EngineCor") => ranked("engine_core", r),
            r if r.starts_with("Worker") => ranked("worker", r),
            r if r.starts_with("APIServer") => "api_server".into(),
            r => snake(r),
        };
    }
    // SGLang: sglang::scheduler[_DP<n>][_TP<n>], sglang::detokenizer, sglang::tokenizer_worker.
    if let Some(rest) = named("sglang::") {
        return match rest {
            r if r.starts_with("sched") => ranked("scheduler", r),
            r if r.starts_with("detok") => "detokenizer".into(),
            r if r.starts_with("token") => "tokenizer".into(),
            r if r.starts_with("gpu_w") => ranked("worker", r),
            r => snake(r),
        };
    }
    let has = |s: &str| line.contains(s);
    if has("vllm.entrypoints") || has("vllm serve") {
        return "api_server".into();
    }
    if has("sglang.launch_server") {
        // The main process: HTTP and the tokenizer.
        return "api_server".into();
    }
    let bin = title.rsplit('/').next().unwrap_or(title);
    match bin {
        "text-generation-launcher" => return "launcher".into(),
        "text-generation-router" => return "router".into(),
        "text-generation-server" => return shard(cmdline),
        "trtllm-serve" => return "api_server".into(),
        "tritonserver" => return "server".into(),
        "triton_python_backend_stub" => return "python_backend_stub".into(),
        _ => {}
    }
    if bin == "ollama" || comm == "ollama" {
        return match cmdline.get(1).map(String::as_str) {
            Some("runner") => "runner".into(),
            _ => "server".into(),
        };
    }
    snake(comm)
}

/// "engine_core_dp0", "worker_tp1_pp0", "scheduler_tp0" from a title's rank suffixes.
fn ranked(base: &str, title: &str) -> String {
    let mut out = base.to_string();
    for part in title.split('_').skip(1) {
        let p = part.to_ascii_lowercase();
        let is_rank = ["dp", "tp", "pp", "ep"].iter().any(|k| {
            p.strip_prefix(k)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
        if is_rank {
            out.push('_');
            out.push_str(&p);
        }
    }
    out
}

/// TGI's shards say their rank (`--rank N`, or the launcher's `shard N` in the title).
fn shard(cmdline: &[String]) -> String {
    let rank = cmdline
        .windows(2)
        .find(|w| w[0] == "--rank")
        .and_then(|w| w[1].parse::<u32>().ok());
    match rank {
        Some(r) => format!("shard_{r}"),
        None => "shard".into(),
    }
}

/// A name as a snake_case label: lower case, anything else but digits turned into `_`.
fn snake(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('_') && !out.is_empty() {
            out.push('_');
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    if out.is_empty() {
        "process".into()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn the_known_layouts_are_named() {
        let cases = [
            ("VLLM::EngineCor", "VLLM::EngineCore_DP0", "engine_core_dp0"),
            ("VLLM::Worker_TP", "VLLM::Worker_TP1", "worker_tp1"),
            (
                "vllm",
                "/usr/bin/python3 /usr/local/bin/vllm serve Qwen/Qwen3-8B",
                "api_server",
            ),
            (
                "python3",
                "python3 -m vllm.entrypoints.openai.api_server --model m",
                "api_server",
            ),
            ("sglang::schedu", "sglang::scheduler_TP0", "scheduler_tp0"),
            ("sglang::schedul", "python3 -m x", "scheduler"),
            ("VLLM::EngineCor", "python3 -c x", "engine_core"),
            ("sglang::detoke", "sglang::detokenizer", "detokenizer"),
            (
                "python3",
                "python3 -m sglang.launch_server --model-path m",
                "api_server",
            ),
            (
                "text-generation",
                "/usr/bin/text-generation-router --port 80",
                "router",
            ),
            (
                "text-generation",
                "text-generation-server serve m --rank 1",
                "shard_1",
            ),
            (
                "tritonserver",
                "/opt/tritonserver/bin/tritonserver --model-repository=/m",
                "server",
            ),
            (
                "triton_python_b",
                "/opt/tritonserver/backends/python/triton_python_backend_stub /m",
                "python_backend_stub",
            ),
            ("ollama", "/usr/bin/ollama runner --model /m", "runner"),
            ("ollama", "/usr/bin/ollama serve", "server"),
        ];
        for (comm, cmd, role) in cases {
            assert_eq!(role_of(comm, &argv(cmd)), role, "{comm} / {cmd}");
        }
    }

    #[test]
    fn an_unknown_process_is_called_by_its_command_name() {
        assert_eq!(
            role_of("demo-server", &argv("/x/tracer workload")),
            "demo_server"
        );
        assert_eq!(role_of("python3", &[]), "python3");
        assert_eq!(role_of("", &[]), "process");
    }
}

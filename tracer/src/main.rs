fn main() -> std::process::ExitCode {
    tracer::cli::main()
}

//! `aws-cni` entry point: the only code that writes the result to stdout or chooses the exit code
//! (log lines reach stdout only when `pluginLogFile` is `stdout`).

use std::io::{Read, Write};

fn main() {
    let vars = std::env::vars().collect();
    let mut stdin = Vec::new();
    // An unreadable stdin is handled as an empty (undecodable) configuration.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let outcome = aws_cni::run(&vars, &stdin);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(outcome.stdout.as_bytes());
    let _ = out.flush();
    #[allow(clippy::exit)]
    std::process::exit(outcome.exit_code);
}

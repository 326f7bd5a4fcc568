//! `aws-cni` entry point: the only code that writes stdout or chooses the exit code.
fn main() {}

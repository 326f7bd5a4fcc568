//! `ipamd` entry point.
fn main() {}
